"""Batcher: continuous batching for one worker process.  Turns from many threads (one per job)
join one decode thread's batch at a step boundary and leave it when their region is done or
their consumer stops; each step is ONE forward for every turn in the batch (model/batch.py
step_batch), and a turn's tokens are those it decodes alone.  A turn of a tenant held to its
share of the workers (priority "held": runtime/jobs/fairness.py) steps only while no other
turn is in the batch: it sits out, its cache and state as its last step left them, and the
others' steps cost what they cost without it.  Knows nothing of Redis, SQL or
jobs: a turn's lease, write-behind, events and cancellation stay with its own thread.

    thread of a turn                            the batch loop
    commit(input)  ----------------------->     each forward: the turns' steps, and the commits
    steps(cache, state, params) -> waiting      asked meanwhile (a turn's input, its last set);
    take its events as they come          <--   admit waiting turns (interactive first, held
    handle each (lease, writer, events)         last, up to max_batch); a done one leaves
    commit(last set)  -------------------->

The loop does not wait for the threads: a turn steps again as soon as its last forward is done,
up to `lead` events ahead of its thread (which then sits out until it catches up), so that the
forwards run back to back while the threads hand their events on; a thread gets its events
`chunk` at a time (each wake-up takes the GIL from the forward that runs).  A thread behind its turn
reads only what its events say (model/decode.py StepEvent.length; runtime/sessions/writer.py).
A thread that stops listening leaves at the next boundary, and only once no forward holds its
turn does it get its cache back.  A turn's input and its last set are committed in the batch
too (a short input: a long one, a recompute, prefills in its own thread, beside the batch, so
that a joining turn's load does not stall the others).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from model.batch import step_batch
from model.decode import StepEvent, prefill, step
from model.kv_cache import KVCache
from model.params import DecodeParams, DecodeState
from model.pool import PooledCache
from model.transformer import SetDLM
from runtime.tables import PRIORITIES

log = logging.getLogger("setflow.batcher")
CLASSES = (*PRIORITIES, "held")  # the order turns are admitted in: the jobs' priorities, then the held tenants'
HELD = CLASSES[-1]  # steps only while no turn of another class is in the batch


@dataclass(eq=False)
class _Commit:
    """Clean tokens to commit to a pooled cache in the next batched forward (a turn's input, its last set)."""

    cache: PooledCache
    ids: list[int]
    positions: list[int]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(eq=False)
class _Seq:
    cache: PooledCache
    state: DecodeState
    params: DecodeParams
    priority: str
    behind: int = 0  # events decoded that its thread has not taken yet (in the outbox or sent)
    stepping: bool = False  # in the forward that runs now: its cache and state are the loop's
    gone: bool = False  # its thread stopped listening: leave at the next boundary
    outbox: list[StepEvent | BaseException] = field(default_factory=list)  # decoded, not sent yet
    events: queue.SimpleQueue[list[StepEvent | BaseException]] = field(default_factory=queue.SimpleQueue)

    def send(self) -> None:
        """Hand the outbox to the thread (one wake-up for all of it)."""
        if self.outbox:
            self.events.put(self.outbox)
            self.outbox = []


class Batcher:
    def __init__(self, model: SetDLM, max_batch: int = 16, max_commit: int = 256, lead: int = 4,
                 chunk: int = 2, on_death: Callable[[BaseException], None] | None = None) -> None:
        """lead: how many events a turn may run ahead of its thread (at least 1: the loop never
        waits for a thread that has taken its last event); chunk: a turn's events go to its
        thread in chunks of this many (the last one, a failure, or a turn at its lead at once).
        A thread woken for every event of every step takes the GIL from the loop's forward as
        often: with 16 turns, one wake-up each per step made the forwards 10-30% slower.
        on_death: called (from the loop's thread) if the loop itself dies, before every waiting
        turn and commit fails: a worker process exits there (workers/process.py), so that its
        jobs are taken over as after a crash instead of failing one after another here."""
        assert max_batch >= 1 and lead >= 1 and chunk >= 1
        self.model = model
        self.max_batch = max_batch
        self.max_commit = max_commit
        self.lead = lead
        self.chunk = min(chunk, lead)
        self.waiting: dict[str, deque[_Seq]] = {p: deque() for p in CLASSES}
        self.running: list[_Seq] = []
        self.commits: list[_Commit] = []
        self.forwards = 0  # batched forwards so far (each one step of every turn in it)
        self.stepped = 0  # sequence-steps so far (sum of batch sizes)
        self._cv = threading.Condition()
        self._stop = False
        self._on_death = on_death
        self._thread = threading.Thread(target=self._run, name="setflow-batcher", daemon=True)
        self._thread.start()

    def steps(self, cache: PooledCache, state: DecodeState, params: DecodeParams,
              priority: str = "interactive") -> Iterator[StepEvent]:
        """The turn's StepEvents, decoded in the shared batch, until its region is done (what
        model.decode.decode yields for it alone).  Closing the iterator early leaves the batch
        at the next boundary; it returns once no forward holds the turn (the cache is the
        caller's again).  The cache and the state run up to `lead` steps ahead of the events."""
        if state.done:  # nothing to decode (max_new_tokens 0): never in a batch
            return
        seq = _Seq(cache, state, params, priority if priority in CLASSES else "batch")
        with self._cv:
            self._open()
            self.waiting[seq.priority].append(seq)
            self._cv.notify_all()
        done = False
        try:
            while not done:
                for ev in self._next(seq.events):
                    with self._cv:
                        seq.behind -= 1
                        if seq.behind == self.lead - 1:  # it may step again
                            self._cv.notify_all()
                    if isinstance(ev, BaseException):
                        raise RuntimeError(f"this turn's batched step failed: {ev!r}") from ev
                    done = ev.done
                    yield ev
        finally:
            if not done:
                with self._cv:
                    seq.gone = True
                    self._cv.notify_all()
                    while seq.stepping:  # its cache goes back to a pool next: never while a forward writes it
                        self._cv.wait(1.0)
                        self._alive()

    def commit(self, cache: KVCache, ids: list[int], positions: list[int]) -> int:
        """model.decode.Commit in the shared batch: the tokens are committed to the cache (a pooled
        one) in the next batched forward, beside the running turns' steps; returns the forwards
        this counts for the turn (1, or 0 for nothing).  A long input (a prefill of more than
        max_commit tokens) runs here alone, so that it does not stretch a step of the batch."""
        if not ids:
            return 0
        if not isinstance(cache, PooledCache) or len(ids) > self.max_commit:
            return prefill(self.model, cache, ids, positions)
        req = _Commit(cache, ids, positions)
        with self._cv:
            self._open()
            self.commits.append(req)
            self._cv.notify_all()
        while not req.done.wait(1.0):
            self._alive()
        if req.error is not None:
            raise RuntimeError(f"this commit's batched forward failed: {req.error!r}") from req.error
        return 1

    def _next(self, events: queue.SimpleQueue[list[StepEvent | BaseException]]) -> list[StepEvent | BaseException]:
        """The turn's next events; never waits on a loop that died."""
        while True:
            try:
                return events.get(timeout=1.0)
            except queue.Empty:
                self._alive()

    def _alive(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the batch loop has stopped")

    def _open(self) -> None:
        """Under the lock: refuse a turn or commit that no loop would ever take."""
        if self._stop:
            raise RuntimeError("the batcher is closed")
        self._alive()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(10)

    def _take(self) -> list[_Seq]:
        """Under the lock: drop the turns whose threads left, admit waiting ones, and return
        those not `lead` events ahead of their threads (marked stepping: the loop's until their
        event is out); held turns only where no other turn runs."""
        self.running = [s for s in self.running if not s.gone]
        for p in CLASSES:
            q = self.waiting[p]
            while q and len(self.running) < self.max_batch:
                s = q.popleft()
                if not s.gone:
                    self.running.append(s)
        others = any(s.priority != HELD for s in self.running)
        batch = [s for s in self.running if s.behind < self.lead and not (others and s.priority == HELD)]
        for s in batch:
            s.stepping = True
        return batch

    def _take_commits(self) -> list[_Commit]:
        """Under the lock: the commits waiting for a forward."""
        commits, self.commits = self.commits, []
        return commits

    def _alone(self, batch: list[_Seq], commits: list[_Commit]) -> list[StepEvent | BaseException]:
        """After a batched forward failed (it changed no state: its commits come after it), each
        turn's step and each commit alone, so that an error is its own turn's only."""
        events: list[StepEvent | BaseException] = []
        for s in batch:
            try:
                events.append(step(self.model, s.cache, s.state, s.params))
            except Exception as e:  # noqa: BLE001 - this turn's own failure
                events.append(e)
        for c in commits:
            try:
                prefill(self.model, c.cache, c.ids, c.positions)
            except Exception as e:  # noqa: BLE001
                c.error = e
        return events

    def _run(self) -> None:
        """The loop, supervised: if it dies (a bug: a forward's own failures are its turns'),
        everything waiting on it fails now rather than at its threads' next 1 s check, and
        nothing new is taken."""
        try:
            self._loop()
        except BaseException as e:
            log.critical("the batch loop died", exc_info=True)
            try:
                if self._on_death is not None:  # first: a worker exits here, its turns failing nowhere
                    self._on_death(e)
            finally:  # on_death returned (or raised): the turns fail now
                with self._cv:
                    self._stop = True
                    self._fail_all([], RuntimeError(f"the batch loop died: {e!r}"))

    def _fail_all(self, commits: list[_Commit], error: BaseException) -> None:
        """Under the lock: every turn and commit the loop holds or waits for gets `error`."""
        for s in self.running + [s for q in self.waiting.values() for s in q]:
            s.stepping = False
            s.behind += 1
            s.outbox.append(error)
            s.send()
        for c in commits + self.commits:
            c.error = error
            c.done.set()
        self.running, self.commits = [], []
        for q in self.waiting.values():
            q.clear()
        self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                batch, commits = self._take(), self._take_commits()
                while not batch and not commits and not self._stop:
                    self._cv.wait()
                    batch, commits = self._take(), self._take_commits()
                if self._stop:
                    self._fail_all(commits, RuntimeError("the batcher was closed"))
                    return
            try:
                events: list[StepEvent | BaseException] = list(step_batch(
                    self.model, [(s.cache, s.state, s.params) for s in batch],
                    [(c.cache, c.ids, c.positions) for c in commits]))
            except Exception:  # noqa: BLE001 - the forward failed, nothing was committed: one at a time
                log.exception("a batched step failed: its turns are stepped one by one")
                events = self._alone(batch, commits)
            for c in commits:
                c.done.set()
            self.forwards += 1
            self.stepped += len(batch) + len(commits)
            with self._cv:
                for s, ev in zip(batch, events):
                    s.stepping = False
                    s.behind += 1
                    s.outbox.append(ev)
                    last = isinstance(ev, BaseException) or ev.done
                    if last or len(s.outbox) >= self.chunk or s.behind >= self.lead:
                        s.send()
                    if last:
                        self.running.remove(s)
                self._cv.notify_all()  # a thread that left waits for its turn's forward to end
