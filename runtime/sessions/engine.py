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
copies a session's first turns into a new session, sharing their K/V segments in Redis when the
parent's manifest holds them (its first turn restores; else it recomputes from SQL), and their
pool blocks when the parent is warm here (its first turn is warm: copy on write); delete()
removes a session from Redis and SQL (runtime/sessions/lifecycle.py, which the API runs too).

Decoding is TurnDecode's (runtime/sessions/decoding.py), alone in the caller's thread or with a
Batcher in one batch with other threads' turns (batcher.py; caches then paged in model/pool.py);
the K/V's way to Redis is TurnWriter's (writer.py).  Greedy decoding gives the same tokens on
every path (tests/runtime/sessions/test_engine.py)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field

from model import checkpoint
from model.decode import StepEvent, prefill
from model.kv_cache import KVCache
from model.params import DecodeError, DecodeParams, DecodeState
from model.pool import KVPool, PooledCache
from model.transformer import SetDLM
from runtime.errors import BadInput, Busy, CorruptState
from runtime.keys import model_name
from runtime.sessions import kv, warmfork
from runtime.sessions.batcher import Batcher
from runtime.sessions.decoding import Stepper, TurnDecode, infill_holes
from runtime.sessions.lifecycle import delete_session, fork_session
from runtime.sessions.records import JobStep, Records
from runtime.sessions.state import params_json, read_state, replayed
from runtime.sessions.store import Manifest, SessionStore
from runtime.sessions.turn import TurnResult
from runtime.sessions.writer import TurnWriter
from runtime.settings import Settings
from runtime.tables import SessionRecord

FP_LEN = 16  # the fingerprint prefix segments and records carry
PATHS = ("auto", "restore", "recompute")


@dataclass
class _Warm:
    cache: KVCache
    state: DecodeState
    turns: int  # the session's turn count it holds (SQL's count is the truth)
    ident: tuple[str, str]  # (tenant, created_at) of the session it was: an id deleted and used again is another


@dataclass
class _Loaded:
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


class Engine:
    WRITE_BEHIND = 64  #: default slots per write-behind batch

    def __init__(self, model: SetDLM, store: SessionStore, records: Records, settings: Settings,
                 warm_sessions: int = 8, write_behind: int = WRITE_BEHIND, batcher: Batcher | None = None,
                 pool: KVPool | None = None) -> None:
        """write_behind: slots per write-behind batch (0: write a turn's K/V at its end only).
        batcher: turns from many threads decoded in one batch (runtime/sessions/batcher.py);
        its caches are paged in `pool`, which it needs (a session running or warm here holds
        the blocks of its tokens; the least recently used warm one gives them back when a cache
        must grow and no block is free).  Without one, each turn decodes alone in its thread."""
        assert batcher is None or pool is not None, "a batcher decodes pool caches"
        self.model, self.store, self.records, self.s = model, store, records, settings
        self.fp = checkpoint.fingerprint(model)[:FP_LEN]
        # what its sessions are bound to besides the weights: the model's name and numerics
        self.model_name, self.numerics = model_name(model.cfg.name), checkpoint.numerics(model)
        self.warm: OrderedDict[str, _Warm] = OrderedDict()
        self.warm_sessions = warm_sessions
        self._rates: dict[str, float] | None = None
        self.write_behind = write_behind
        self.batcher = batcher
        self.pool = pool
        self._rows = threading.Condition()  # guards warm and pool: turns of many threads share them
        # turns holding a pool cache now, at most as many as it holds whole contexts: a running
        # turn then always finds its next block (an idle warm session gives its own back)
        self._turns, self._max_turns = 0, 1
        if pool is not None:
            pool.reclaim = self._reclaim  # a cache that must grow evicts an idle warm session
            # (a pool below one whole context, as tests and benchmarks build, still admits one turn: it
            # may then meet PoolExhausted mid-decode; a worker's pool holds batch_sessions contexts)
            self._max_turns = max(1, pool.blocks // -(-model.cfg.max_seq_len // pool.block_size))

    # ---- sessions ---------------------------------------------------------------------------

    def open(self, tenant: str, session_id: str | None = None) -> str:
        return self.records.create_session(tenant, self.fp, session_id, model=(self.model_name, self.numerics)).id

    def fork(self, session: str, tenant: str, turn: int, new_id: str | None = None) -> str:
        """A new session whose turns are copies of `session`'s turns 0..turn, sharing their K/V
        segments in Redis when the parent's manifest holds them (lifecycle.fork_session), and
        their pool blocks when the parent is warm here (runtime/sessions/warmfork.py)."""
        child = fork_session(self.store, self.records, session, tenant, turn, new_id)
        if self.pool is not None:
            rows, rec = self.records.turns(child.id, tenant), self.records.get_session(child.id, tenant)
            with self._rows:  # a warm session is idle: its cache is nobody's; the child's is kept at once
                w = self.warm.get(session)
                got = warmfork.shared(w.cache, rows) if w is not None else None
                if got is not None:
                    self._keep_warm(child.id, _Warm(*got, len(rows), (rec.tenant, str(rec.created_at))))
        return child.id

    def delete(self, session: str, tenant: str) -> None:
        """Delete a session everywhere (lifecycle.delete_session: Redis, then SQL, under its
        lease; Busy while a turn holds it), then its warm state here.  Other engines' warm
        copies are not reached: their next turn on it finds no session (NotFound)."""
        delete_session(self.store, self.records, session, tenant)
        with self._rows:
            w = self.warm.pop(session, None)
        if w is not None:
            self._drop(w.cache)

    def run_turn(self, session: str, tenant: str, input_ids: list[int], params: DecodeParams,
                 prefer: str = "auto", text: str = "", job: JobStep | None = None,
                 infill: bool = False) -> TurnResult:
        with closing(self.turn(session, tenant, input_ids, params, prefer, text, job, infill)) as events:
            for ev in events:
                if isinstance(ev, TurnResult):
                    return ev
        raise AssertionError("turn() ends with its TurnResult")

    def turn(self, session: str, tenant: str, input_ids: list[int], params: DecodeParams,
             prefer: str = "auto", text: str = "", job: JobStep | None = None, infill: bool = False,
             priority: str = "interactive") -> Generator[StepEvent | TurnResult, None, None]:
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
        the holes' offsets in meta["infill"].  priority: the batcher admits interactive turns
        before batch ones, and steps "held" ones only while no other turn is in the batch."""
        rec = self._check(session, tenant, input_ids, prefer, infill)  # before anything is taken
        with self.store.lease(session) as lease:
            if (done := self.replay(session, tenant, input_ids, job)) is not None:
                yield done
                return
            with self._admitted():  # a place among the turns that hold pool caches
                with lease.busy():  # a restore or a recompute may outlast the lease: kept meanwhile
                    load = self._load(session, tenant, rec, prefer)
                try:
                    lease.keep()  # the load may have been long
                    t = time.perf_counter()
                    with lease.busy():  # an infill prefills its context here
                        turn = self._begin(session, load, input_ids, params, infill)
                    with TurnWriter(self.store, lease, tenant, self.fp, load.manifest, load.reuse, self.write_behind) as w:
                        with closing(turn.steps(self._stepper(priority))) as steps:  # closed before _drop frees
                            for ev in lease.busily(steps):  # each step's forwards with the lease kept
                                lease.keep()  # a long turn keeps its lease
                                w.add(turn.cache, ev)
                                yield ev
                    load.costs["decode_s"] = time.perf_counter() - t
                    lease.renew()  # LeaseLost here: another holder may have moved on; write nothing
                    with lease.busy():  # the writes, however long they take, under a lease kept
                        self._append(session, tenant, load, turn, params, text, job)
                        self._save(session, load, turn, w, params)
                finally:  # a turn that does not complete leaves no warm state, and frees its blocks
                    if not self._is_warm(session, load.cache):
                        self._drop(load.cache)
            yield TurnResult(session, turn.tokens, load.path, load.costs, load.events, turn.nfe, load.turns)

    # ---- a turn's parts ---------------------------------------------------------------------

    def _check(self, session: str, tenant: str, input_ids: list[int], prefer: str, infill: bool) -> SessionRecord:
        """The session (NotFound for unknown or another tenant's), checked against the request:
        BadInput for anything this engine cannot run."""
        if prefer not in PATHS:
            raise BadInput(f"prefer must be one of {PATHS}, got {prefer!r}")
        rec = self.records.get_session(session, tenant)
        if rec.model_fingerprint not in ("", self.fp):  # "": opened by the API, bound by its first turn
            raise BadInput(f"session {session} belongs to model {rec.model_fingerprint}, this engine runs {self.fp}")
        if rec.numerics not in ("", self.numerics):  # a CPU fp32 session is not decoded in bf16 on a GPU
            raise BadInput(f"session {session} is bound to numerics {rec.numerics}, this engine runs {self.numerics}")
        if not input_ids or len(input_ids) > self.s.max_input_tokens:
            raise BadInput(f"input must be 1..{self.s.max_input_tokens} tokens, got {len(input_ids)}")
        if infill:
            infill_holes(self.model.cfg, input_ids)
        return rec

    def replay(self, session: str, tenant: str, input_ids: list[int], job: JobStep | None) -> TurnResult | None:
        """The turn this job step wrote already, if it did: the tokens it generated, after the
        input or at an infill's holes.  turn() checks under the lease (a holder that wrote this
        step has released it by now); without it, only for a step the job's row counts as
        committed (runtime/jobs/context.py)."""
        done = self.records.turn_by_job(session, tenant, job.job_id, job.step) if job is not None else None
        if done is None:
            return None
        offsets = done.meta.get("infill")
        # split where the row says its input ended: the input rebuilt from the job's spec now may
        # differ from the one the step had (a job that outlived a change of how specs are read)
        n_input = int(done.meta.get("n_input", len(input_ids)))
        tokens = [done.token_ids[i] for i in offsets] if offsets is not None else list(done.token_ids[n_input:])
        return TurnResult(session, tokens, "done", events=[f"turn {done.index} was written by this job step already"],
                          turn=done.index)

    def _begin(self, session: str, load: _Loaded, input_ids: list[int], params: DecodeParams,
               infill: bool) -> TurnDecode:
        try:
            commit = self.batcher.commit if self.batcher is not None else None
            return TurnDecode(self.model, load.cache, load.state, input_ids, params, infill, commit)
        except DecodeError:  # refused before anything changed: a warm session stays warm
            if load.path == "warm" and load.state is not None:
                self._keep_warm(session, _Warm(load.cache, load.state, load.turns, load.ident))
            raise

    def _append(self, session: str, tenant: str, load: _Loaded, turn: TurnDecode, params: DecodeParams, text: str,
                job: JobStep | None) -> None:
        """The turn's SQL row, at the index read under the lease: a late writer's row is refused
        (StaleWrite), never appended after another turn that did not see it."""
        t = time.perf_counter()
        meta: dict[str, object] = {"path": load.path, "params": params_json(params), "rng": turn.state.rng,
                                   "n_input": len(turn.input)}  # the row's input/output split
        if turn.holes is not None:
            meta["infill"] = turn.holes
        self.records.append_turn(session, tenant, "assistant", text, turn.row, turn.ledger, meta=meta,
                                 index=load.turns, job=job, fingerprint=self.fp,
                                 model=(self.model_name, self.numerics))
        load.costs["sql_s"] = time.perf_counter() - t

    def _save(self, session: str, load: _Loaded, turn: TurnDecode, writer: TurnWriter, params: DecodeParams) -> None:
        """Redis after SQL (the turn is durable already: a failed save is an event, and costs the
        next turn elsewhere a recompute), then the session stays warm here."""
        t = time.perf_counter()
        events = writer.save(turn.cache, turn.state, params_json(params), load.turns + 1)
        self._keep_warm(session, _Warm(turn.cache, turn.state, load.turns + 1, load.ident))
        load.events += events
        load.costs["store_s"] = time.perf_counter() - t

    def _stepper(self, priority: str) -> Stepper | None:
        if self.batcher is None:
            return None
        batcher = self.batcher
        return lambda cache, state, params: batcher.steps(cache, state, params, priority)  # type: ignore[arg-type]

    # ---- loading ----------------------------------------------------------------------------

    def _load(self, session: str, tenant: str, rec: SessionRecord, prefer: str) -> _Loaded:
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
              ident: tuple[str, str]) -> _Loaded:
        with self._rows:
            w = self.warm.pop(session, None)  # the turn mutates it: back in only when the turn completes
        if w is not None and w.turns == turns and w.ident == ident:  # SQL is the truth: no other holder added a turn
            return _Loaded(w.cache, w.state, "warm", turns, ident, m)
        if w is not None:
            self._drop(w.cache)
        if turns == 0:
            return _Loaded(self._empty(), None, "new", turns, ident, m)
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
                    return _Loaded(cache, state, "restore", turns, ident, m, costs=costs, events=events)
                except CorruptState as e:
                    events.append(f"restore failed ({e.message}): recomputed from SQL")
        cache, state = self._recompute(session, tenant)
        return _Loaded(cache, state, "recompute", turns, ident, m, costs=costs, events=events)

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

    def _recompute(self, session: str, tenant: str) -> tuple[KVCache, DecodeState]:
        turns = self.records.turns(session, tenant)
        ledger = [(p, t) for turn in turns for p, t in turn.ledger]
        cache = self._empty(len(ledger))
        with self._owned(cache):
            if ledger:  # one causal prefill in commit order gives the same K/V (model/decode.py invariant I5)
                pos, tok = zip(*ledger)
                prefill(self.model, cache, list(tok), list(pos))
            return cache, replayed(ledger, turns[-1].meta.get("rng") if turns else None)

    def _keep_warm(self, session: str, w: _Warm) -> None:
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

    # ---- the cost model ---------------------------------------------------------------------

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

