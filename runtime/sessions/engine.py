"""Engine: one session turn at a time, resumed from the cheapest place that holds the session.

Engine.turn(session, tenant, input_ids, params) yields the decoder's StepEvents, then one
TurnResult.  Per turn it takes the session's lease, then loads the state by one of:

    warm       this process still holds the session (at the turn count SQL holds)
    restore    the manifest and segments in Redis (checked: fingerprint, checksums, order)
    recompute  one causal prefill of the commit-order ledger kept in SQL

choosing restore or recompute by a cost model calibrated on this machine (Redis bytes/s and
prefill tokens/s, measured once per engine); a restore that fails its checks falls back to
recompute and says so in the result (resume.py; the warm sessions are warm.py's).  After
decoding, the last pending set is committed (one forward, so the cache holds every token of the
turn); the turn's row is written to SQL (the turn is durable from then on); then the new slots
go to Redis as segments and the manifest advances by compare-and-set under the lease (renewed
during long turns).  A crash or a failed save
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

import time
from collections.abc import Generator
from contextlib import closing

from model import checkpoint
from model.decode import StepEvent
from model.params import DecodeError, DecodeParams
from model.pool import KVPool
from model.transformer import SetDLM
from runtime.errors import BadInput
from runtime.keys import model_name
from runtime.sessions.batcher import Batcher
from runtime.sessions.decoding import Stepper, TurnDecode, infill_holes
from runtime.sessions.lease import Held
from runtime.sessions.lifecycle import delete_session, fork_session
from runtime.sessions.records import JobStep, Records
from runtime.sessions.resume import Loaded, Resume
from runtime.sessions.store import SessionStore, params_json
from runtime.sessions.turn import TurnResult
from runtime.sessions.warm import Warm, shared
from runtime.sessions.writer import TurnWriter
from runtime.settings import Settings
from runtime.tables import SessionRecord

FP_LEN = 16  # the fingerprint prefix segments and records carry
PATHS = ("auto", "restore", "recompute")


class Engine(Resume):
    """The recipe of a turn; its loading is Resume's (resume.py), its warm sessions WarmSessions' (warm.py)."""

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
        self._rates: dict[str, float] | None = None  # the cost model's, measured at its first use
        self.write_behind = write_behind
        self.batcher = batcher
        super().__init__(warm_sessions, pool, model.cfg.max_seq_len)  # the warm sessions (warm.py)

    # ---- sessions ---------------------------------------------------------------------------

    def open(self, tenant: str, session_id: str | None = None) -> str:
        return self.records.create_session(tenant, self.fp, session_id, model=(self.model_name, self.numerics)).id

    def fork(self, session: str, tenant: str, turn: int, new_id: str | None = None) -> str:
        """A new session whose turns are copies of `session`'s turns 0..turn, sharing their K/V
        segments in Redis when the parent's manifest holds them (lifecycle.fork_session), and
        their pool blocks when the parent is warm here (warm.py shared)."""
        child = fork_session(self.store, self.records, session, tenant, turn, new_id)
        if self.pool is not None:
            rows, rec = self.records.turns(child.id, tenant), self.records.get_session(child.id, tenant)
            with self._rows:  # a warm session is idle: its cache is nobody's; the child's is kept at once
                w = self.warm.get(session)
                got = shared(w.cache, rows) if w is not None else None
                if got is not None:
                    self._keep_warm(child.id, Warm(*got, len(rows), (rec.tenant, str(rec.created_at))))
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
                with lease.busy():  # 1. load: a restore or a recompute may outlast the lease, kept meanwhile
                    load = self._load(session, tenant, rec, prefer)
                try:
                    turn, w = yield from self._decode(session, tenant, lease, load, input_ids, params, infill, priority)
                    self._commit(session, tenant, lease, load, turn, w, params, text, job)
                finally:  # a turn that does not complete leaves no warm state, and frees its blocks
                    if not self._is_warm(session, load.cache):
                        self._drop(load.cache)
            yield TurnResult(session, turn.tokens, load.path, load.costs, load.events, turn.nfe, load.turns)

    # ---- a turn's parts ---------------------------------------------------------------------

    def _decode(self, session: str, tenant: str, lease: Held, load: Loaded, input_ids: list[int], params: DecodeParams,
                infill: bool, priority: str) -> Generator[StepEvent, None, tuple[TurnDecode, TurnWriter]]:
        """2. Decode with the writer: each step yielded as it ends, its K/V written behind to
        Redis, the lease kept throughout."""
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
        return turn, w

    def _commit(self, session: str, tenant: str, lease: Held, load: Loaded, turn: TurnDecode, w: TurnWriter,
                params: DecodeParams, text: str, job: JobStep | None) -> None:
        """3. Commit: the turn's SQL row (durable from then on), then its K/V and manifest in
        Redis, under a lease renewed first."""
        lease.renew()  # LeaseLost here: another holder may have moved on; write nothing
        with lease.busy():  # the writes, however long they take, under a lease kept
            self._append(session, tenant, load, turn, params, text, job)
            self._save(session, load, turn, w, params)

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

    def _begin(self, session: str, load: Loaded, input_ids: list[int], params: DecodeParams,
               infill: bool) -> TurnDecode:
        try:
            commit = self.batcher.commit if self.batcher is not None else None
            return TurnDecode(self.model, load.cache, load.state, input_ids, params, infill, commit)
        except DecodeError:  # refused before anything changed: a warm session stays warm
            if load.path == "warm" and load.state is not None:
                self._keep_warm(session, Warm(load.cache, load.state, load.turns, load.ident))
            raise

    def _append(self, session: str, tenant: str, load: Loaded, turn: TurnDecode, params: DecodeParams, text: str,
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

    def _save(self, session: str, load: Loaded, turn: TurnDecode, writer: TurnWriter, params: DecodeParams) -> None:
        """Redis after SQL (the turn is durable already: a failed save is an event, and costs the
        next turn elsewhere a recompute), then the session stays warm here."""
        t = time.perf_counter()
        events = writer.save(turn.cache, turn.state, params_json(params), load.turns + 1)
        self._keep_warm(session, Warm(turn.cache, turn.state, load.turns + 1, load.ident))
        load.events += events
        load.costs["store_s"] = time.perf_counter() - t

    def _stepper(self, priority: str) -> Stepper | None:
        if self.batcher is None:
            return None
        batcher = self.batcher
        return lambda cache, state, params: batcher.steps(cache, state, params, priority)  # type: ignore[arg-type]


