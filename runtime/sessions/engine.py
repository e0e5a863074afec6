"""Engine: one session turn at a time, resumed from the cheapest place that holds the session.

Engine.turn(session, tenant, input_ids, params) yields the decoder's StepEvents, then one
TurnResult.  Per turn it takes the session's lease, then loads the state by one of:

    warm       this process still holds the session (at the turn count SQL holds)
    restore    the manifest and segments in Redis (checked: fingerprint, checksums, order)
    recompute  one causal prefill of the commit-order ledger kept in SQL

choosing restore or recompute by a cost model calibrated on this machine (Redis bytes/s and
prefill tokens/s, measured once per engine); a restore that fails its checks falls back to
recompute and says so in the result.  After decoding, the last pending set is committed (one
forward, so the cache holds every token of the turn); the turn's row is written to SQL (the turn
is durable from then on); then the new slots go to Redis as segments and the manifest advances
by compare-and-set under the lease (renewed during long turns).  A crash or a failed save
between the two leaves Redis one turn behind SQL, which the next turn detects (the manifest
counts turns) and recomputes.  A turn abandoned midway (the caller stops iterating) writes
nothing and leaves no warm state behind.

An infill turn (infill=True: the input holds mask_id at holes) is decoded in place after its
context; its ledger is in commit order like any other, so every path above rebuilds it.  fork()
copies a session's first turns into a new session (recomputed from SQL on its first turn);
delete() removes a session from Redis and SQL.

Greedy decoding gives the same tokens on every path (tests/runtime/test_engine.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from contextlib import closing
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from model import checkpoint
from model.decode import (StepEvent, begin_infill_turn, begin_turn, commit_pending, decode, prefill)
from model.params import DecodeError, DecodeParams, DecodeState
from model.kv_cache import KVCache
from model.transformer import SetDLM
from runtime.sessions import kv
from runtime.sessions.records import JobStep, Records
from runtime.errors import BadInput, CorruptState, SetflowError
from runtime.settings import Settings
from runtime.sessions.store import Lease, Manifest, SessionStore
from runtime.sessions.turn import TurnResult
from runtime.sessions.writebehind import WriteBehind

FP_LEN = 16  # the fingerprint prefix segments and records carry
PATHS = ("auto", "restore", "recompute")


@dataclass
class _Warm:
    cache: KVCache
    state: DecodeState
    turns: int  # the session's turn count it holds (SQL's count is the truth)
    ident: tuple[str, str]  # (tenant, created_at) of the session it was: an id deleted and used again is another


class Engine:
    WRITE_BEHIND = 64  #: default slots per write-behind batch

    def __init__(self, model: SetDLM, store: SessionStore, records: Records, settings: Settings,
                 warm_sessions: int = 8, write_behind: int = WRITE_BEHIND) -> None:
        """write_behind: slots per write-behind batch (0: write a turn's K/V at its end only)."""
        self.model = model
        self.store = store
        self.records = records
        self.s = settings
        self.fp = checkpoint.fingerprint(model)[:FP_LEN]
        self.warm: OrderedDict[str, _Warm] = OrderedDict()
        self.warm_sessions = warm_sessions
        self._rates: dict[str, float] | None = None
        self.write_behind = write_behind

    # ---- sessions ---------------------------------------------------------------------------

    def open(self, tenant: str, session_id: str | None = None) -> str:
        return self.records.create_session(tenant, self.fp, session_id).id

    def fork(self, session: str, tenant: str, turn: int, new_id: str | None = None) -> str:
        """A new session whose turns are copies of `session`'s turns 0..turn (runtime/db.py
        Records.fork).  It has no Redis state: its first turn recomputes from SQL."""
        return self.records.fork(session, tenant, turn, new_id).id

    def delete(self, session: str, tenant: str) -> None:
        """Delete a session everywhere: its Redis state (manifest, segments no other session
        names, byte accounts), its warm state here, then its SQL rows (turns and jobs by
        cascade).  Under the session's lease, so no turn runs meanwhile (Busy while one does).
        Redis first: a failure between the two leaves a whole session in SQL (its next turn
        recomputes) and the delete can be retried; the other order could leave K/V bytes of a
        deleted session in Redis until their TTL.  Other engines' warm copies are not reached:
        their next turn on it finds no session (NotFound)."""
        self.records.get_session(session, tenant)  # NotFound for unknown or another tenant's
        lease = self.store.acquire(session)
        try:
            self.warm.pop(session, None)
            self.store.drop(session, tenant, lease)
            self.records.delete_session(session, tenant)
        finally:
            try:
                self.store.release(lease)
            except redis.RedisError:
                pass  # the lease expires by itself

    def run_turn(self, session: str, tenant: str, input_ids: list[int], params: DecodeParams,
                 prefer: str = "auto", text: str = "", job: JobStep | None = None,
                 infill: bool = False) -> TurnResult:
        with closing(self.turn(session, tenant, input_ids, params, prefer, text, job, infill)) as events:
            for ev in events:
                if isinstance(ev, TurnResult):
                    return ev
        raise AssertionError("turn() ends with its TurnResult")

    def turn(self, session: str, tenant: str, input_ids: list[int], params: DecodeParams,
             prefer: str = "auto", text: str = "", job: JobStep | None = None, infill: bool = False
             ) -> Generator[StepEvent | TurnResult, None, None]:
        """prefer: "auto" (the cost model), or "restore" / "recompute" to force that path when
        the session is not warm (tests and benchmarks); a failed restore still recomputes.
        text: the turn's text as the workflow rendered it (kept in its SQL row; the engine
        itself works on token ids).  job: the job step running this turn: if that step's turn
        is in SQL already (a redelivered task), it is returned as it was written (path "done")
        and nothing is decoded or written; the turn is written only while the job is still held
        by this claim (ClaimLost otherwise).  infill: input_ids holds the model's mask_id at
        holes (at least one), decoded in place after the input's context is prefilled
        (begin_infill_turn; params.max_new_tokens is not used, no stop criteria); the result's
        tokens are the holes', in position order, and the SQL row holds the filled input, with
        the holes' offsets in meta["infill"]."""
        if prefer not in PATHS:
            raise BadInput(f"prefer must be one of {PATHS}, got {prefer!r}")
        rec = self.records.get_session(session, tenant)  # NotFound for unknown or another tenant's
        if rec.model_fingerprint not in ("", self.fp):  # "": opened by the API, bound by its first turn
            raise BadInput(f"session {session} belongs to model {rec.model_fingerprint}, this engine runs {self.fp}")
        if not input_ids or len(input_ids) > self.s.max_input_tokens:
            raise BadInput(f"input must be 1..{self.s.max_input_tokens} tokens, got {len(input_ids)}")
        holes = self._holes(input_ids) if infill else None  # BadInput before anything is taken
        lease = self.store.acquire(session)
        try:
            # checked under the lease: a holder that wrote this step has released it by now
            done = self.records.turn_by_job(session, tenant, job.job_id, job.step) if job is not None else None
            if done is not None:  # the tokens it generated: after the input, or at an infill's holes
                offsets = done.meta.get("infill")
                gen_done = [done.token_ids[i] for i in offsets] if offsets is not None \
                    else list(done.token_ids[len(input_ids):])
                yield TurnResult(session, gen_done, "done",
                                 events=[f"turn {done.index} was written by this job step already"], turn=done.index)
                return
            t0 = time.perf_counter()
            turns = self.records.turn_count(session, tenant)
            manifest = self.store.read(session)
            ident = (rec.tenant, str(rec.created_at))
            cache, state, path, costs, events = self._load(session, tenant, turns, manifest, prefer, ident)
            costs["load_s"] = time.perf_counter() - t0
            n0 = cache.length
            p0 = len(state.tokens) if state is not None else 0  # the input's first position
            # keep the stored segments when they are this cache's: restored from them, or warm
            # with a manifest that holds this very turn count and cache length
            reuse = path == "restore" or (path == "warm" and manifest is not None and manifest.fingerprint == self.fp
                                          and manifest.state.get("turns") == turns and manifest.slots == n0)
            base = self._base(session, tenant, manifest, reuse)
            wb = WriteBehind(self.store, base, lease) if self.write_behind else None
            written, top, cut = base.slots, -1, False  # slots handed to the writer, their highest position
            t1 = time.perf_counter()
            self.store.renew(lease)  # the load may have been long: the lease counts from here
            renewed = time.monotonic()
            try:
                try:
                    if holes is not None:
                        state = begin_infill_turn(self.model, cache, state, input_ids, params)
                    else:
                        state = begin_turn(self.model, cache, state, input_ids, params)
                except DecodeError:  # refused before anything changed: a warm session stays warm
                    if path == "warm" and state is not None:
                        self._keep_warm(session, _Warm(cache, state, turns, ident))
                    raise
                start = state.start
                for ev in decode(self.model, cache, state, params):
                    if time.monotonic() - renewed > self.s.lease_ms / 3000:  # a long turn keeps its lease
                        self.store.renew(lease)
                        renewed = time.monotonic()
                    # a stop drops positions >= ev.cut and rolls the cache back to the first slot
                    # holding one: slots handed over stay valid iff all their positions are below
                    # it; else the turn's slots are all rewritten at its end
                    cut = cut or (ev.cut is not None and top >= ev.cut)
                    if wb is not None and not cut and cache.length - written >= self.write_behind:
                        wb.submit(kv.to_segments(cache, written, cache.length, self.fp, self.s.segment_bytes))
                        top = max(top, int(cache.pos[written:cache.length].max()))
                        written = cache.length
                    yield ev
                commit_pending(self.model, cache, state)
            finally:
                latest = wb.close() if wb is not None else base
            if holes is not None:  # every hole is decoded (no stop cuts an infill region)
                generated = [state.tokens[p0 + i] for i in holes]
                row = state.tokens[p0:]  # the input with its holes filled
            else:
                generated = [t for t in state.tokens[start:] if t != self.model.cfg.mask_id]
                row = list(input_ids) + generated
            costs["decode_s"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            ledger = list(zip(cache.positions[n0:], cache.tokens[n0:]))
            self.store.renew(lease)  # LeaseLost here: another holder may have moved on; write nothing
            # at the index read under the lease: a late writer's row is refused (StaleWrite), never
            # appended after another turn that did not see it
            meta: dict[str, object] = {"path": path, "params": _params_json(params), "rng": state.rng,
                                       "n_input": len(input_ids)}  # the row's input/output split
            if holes is not None:
                meta["infill"] = holes
            self.records.append_turn(session, tenant, "assistant", text, row, ledger, meta=meta,
                                     index=turns, job=job, fingerprint=self.fp)
            costs["sql_s"] = time.perf_counter() - t2
            t4 = time.perf_counter()
            try:  # the turn is durable already; a failed save costs the next turn a recompute
                behind_ok = wb is not None and wb.error is None and not cut
                self._save(latest, cache, state, params, turns + 1, lease,
                           written if behind_ok else base.slots, latest.behind if behind_ok else [])
            except (SetflowError, redis.RedisError) as e:
                events.append(f"redis save failed ({e}): the next turn here is warm, elsewhere recomputed")
            self._keep_warm(session, _Warm(cache, state, turns + 1, ident))
            if wb is not None and wb.error is not None:
                events.append(f"write-behind stopped ({wb.error}): the turn was written at its end")
            costs["store_s"] = time.perf_counter() - t4
            yield TurnResult(session, generated, path, costs, events, state.nfe, turns)
        finally:
            try:
                self.store.release(lease)
            except redis.RedisError:
                pass  # the lease expires by itself; the error that brought us here matters more

    def _holes(self, input_ids: list[int]) -> list[int]:
        """An infill input's hole offsets (where it holds mask_id); BadInput without a hole or
        with an id outside the vocabulary."""
        cfg = self.model.cfg
        if any(not isinstance(t, int) or not 0 <= t < cfg.vocab_size for t in input_ids):
            raise BadInput(f"input ids must be token ids in 0..{cfg.vocab_size - 1} (mask_id {cfg.mask_id} at holes)")
        holes = [i for i, t in enumerate(input_ids) if t == cfg.mask_id]
        if not holes:
            raise BadInput(f"an infill turn needs at least one hole (mask_id {cfg.mask_id})")
        return holes

    # ---- loading ----------------------------------------------------------------------------

    def _load(self, session: str, tenant: str, turns: int, m: Manifest | None, prefer: str, ident: tuple[str, str]
              ) -> tuple[KVCache, DecodeState | None, str, dict[str, float], list[str]]:
        costs: dict[str, float] = {}
        events: list[str] = []
        w = self.warm.get(session)
        self.warm.pop(session, None)  # the turn mutates it: back in only when the turn completes
        if w is not None and w.turns == turns and w.ident == ident:  # SQL is the truth: no other holder added a turn
            return w.cache, w.state, "warm", costs, events
        if turns == 0:
            return self._empty(), None, "new", costs, events
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
                    return cache, state, "restore", costs, events
                except CorruptState as e:
                    events.append(f"restore failed ({e.message}): recomputed from SQL")
        cache, state = self._recompute(session, tenant)
        return cache, state, "recompute", costs, events

    def _empty(self) -> KVCache:
        w = next(self.model.parameters())
        return KVCache.for_model(self.model.cfg, dtype=w.dtype, device=w.device)

    def _restore(self, m: Manifest) -> tuple[KVCache, DecodeState]:
        w = next(self.model.parameters())
        try:
            led = m.state["ledger"]
            state = DecodeState.from_json(m.state["decode"])
            positions, tokens = list(led[0]), list(led[1])
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CorruptState(f"manifest state unreadable: {e!r}") from e
        cache = kv.from_segments(self.store.get_segments(m.segments), self.fp, positions, tokens, w.device)
        if cache.k.dtype != w.dtype:
            raise CorruptState(f"segments hold {cache.k.dtype}, the model runs {w.dtype}")
        return cache, state

    def _recompute(self, session: str, tenant: str) -> tuple[KVCache, DecodeState]:
        turns = self.records.turns(session, tenant)
        ledger = [(p, t) for turn in turns for p, t in turn.ledger]
        cache = self._empty()
        if ledger:
            # one causal prefill in commit order gives the same K/V (model/decode.py invariant I5)
            pos, tok = zip(*ledger)
            cache.reserve(len(ledger))
            prefill(self.model, cache, list(tok), list(pos))
        seq = [0] * (max(p for p, _ in ledger) + 1 if ledger else 0)
        for p, t in ledger:
            seq[p] = t
        state = DecodeState(tokens=seq, rng=turns[-1].meta.get("rng") if turns else None)
        return cache, state

    # ---- saving -----------------------------------------------------------------------------

    def _base(self, session: str, tenant: str, m: Manifest | None, reuse: bool) -> Manifest:
        """What this turn's writes start from: the stored manifest with its segments when the
        turn started from them (warm or restored); else one that names none and is not
        restorable (turns -1) until the turn commits, with the stored generation."""
        if reuse and m is not None:
            return replace(m, behind=[])
        return Manifest(session, tenant, self.fp, m.gen if m is not None else 0, state={"turns": -1})

    def _save(self, latest: Manifest, cache: KVCache, state: DecodeState, params: DecodeParams, turns: int,
              lease: Lease, written: int, behind: list[str]) -> None:
        """The turn's commit in Redis: the segments of slots [0, latest.slots) as they were,
        then `behind` (slots up to `written`, written during the turn), then the rest."""
        rest = self.store.put_segments(kv.to_segments(cache, written, cache.length, self.fp, self.s.segment_bytes)) \
            if cache.length > written else []
        # the decode state (sequence, cursor, pending set, RNG), the last turn's parameters, the
        # slots' (position, token) ledger in commit order, and how many turns it holds
        body = {"decode": state.to_json(), "params": _params_json(params), "ledger": [cache.positions, cache.tokens],
                "turns": turns}
        new = replace(latest, segments=latest.segments + behind + rest, slots=cache.length, state=body, behind=[])
        self.store.commit(new, lease)

    def _keep_warm(self, session: str, w: _Warm) -> None:
        self.warm[session] = w
        self.warm.move_to_end(session)
        while len(self.warm) > self.warm_sessions:
            self.warm.popitem(last=False)

    # ---- the cost model ---------------------------------------------------------------------

    def rates(self) -> dict[str, float]:
        """Measured once per engine: pipelined Redis read bytes/s (through the store, 4 MiB in
        segments) and causal prefill tokens/s of this model on this device (256 tokens)."""
        if self._rates is None:
            blob = [b"\x00" * self.s.segment_bytes] * 4
            ids = self.store.put_segments(blob)
            t = time.perf_counter()
            self.store.get_segments(ids)
            redis_bps = len(blob) * self.s.segment_bytes / max(time.perf_counter() - t, 1e-6)
            self.store.r.delete(*[self.store.k.segment(i) for i in ids])
            n = min(256, self.model.cfg.max_seq_len)
            cache = self._empty()
            cache.reserve(n)
            t = time.perf_counter()
            prefill(self.model, cache, [self.model.cfg.bos_id] * n, list(range(n)))
            tps = n / max(time.perf_counter() - t, 1e-6)
            self._rates = {"redis_bytes_per_s": redis_bps, "prefill_tokens_per_s": tps}
        return self._rates


def _params_json(p: DecodeParams) -> dict[str, Any]:
    return {"policy": p.policy, "window": p.window, "tau": p.tau, "max_new_tokens": p.max_new_tokens,
            "temperature": p.temperature, "seed": p.seed}

