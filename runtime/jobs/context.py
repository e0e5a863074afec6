"""What a workflow gets to run a job: the Turns seam (workflows/turn.py) over the job's session,
whose `turn` keeps the job's step counter so that a redelivered job resumes at its first step
not yet committed.

Each turn a job writes is tagged (job id, step) in SQL, uniquely: a step whose turn is already
there (the worker died after writing it, before the job row moved on) is returned as written,
never decoded and appended again.  Every decode step checks for cancellation and queues its step
event, without I/O (JobChannel, below, does the Redis side on its own thread); the job's SQL
lease is renewed every third of its length.  A cancelled turn is abandoned before its commit:
the session stays at its last turn.  close() when the attempt ends.

JobChannel, a running job's link to the outside, kept off the decode loop: one thread per running job
- sends the step events the loop buffers, every FLUSH_S (one pipelined write);
- listens for the job's cancellation (pub/sub: it arrives within a round trip of being asked);
- renews the job's SQL lease every third of job_lease_s (also while the session loads, waits for
  its lease or recomputes), and learns there of a cancellation or of a lost claim.
The loop itself does no I/O per step: it appends an event and reads two flags.  Measured: a
synchronous per-step Redis round trip made the shipped model's decoding 17% slower on these
2-core machines (docs/BENCHMARKS.md); this costs nothing measurable.

If Redis goes away the thread keeps trying (every 0.2 s) and subscribes again; events buffered
meanwhile are sent when it is back (at most events_maxlen of them: the oldest are dropped).
Sends happen under one lock, so the stream keeps the order in which events were buffered."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import redis

from domain.facts import Slots
from model.config import ModelConfig
from model.params import DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput, Cancelled, ClaimLost, TimeLimit
from runtime.jobs.datasets import Datasets
from runtime.jobs.events import FLUSH_S, JobEvents
from runtime.jobs.routing import Routing
from runtime.jobs.rows import Claim, Jobs
from runtime.sessions.engine import Engine
from runtime.sessions.metrics import TurnMetrics
from runtime.sessions.once import once
from runtime.sessions.records import JobStep
from runtime.sessions.turn import TurnResult

log = logging.getLogger("setflow.worker")


class JobChannel:
    def __init__(self, events: JobEvents, tenant: str, job: str, beat: Callable[[], bool] | None = None,
                 beat_every_s: float = 20.0) -> None:
        """beat: renews the job's lease, returns whether a cancellation was asked (SQL), raises
        ClaimLost when the job is no longer ours; called every beat_every_s."""
        self.events = events
        self.tenant, self.job = tenant, job
        self.cancelled = threading.Event()
        self.lost = threading.Event()  # the claim is no longer ours: stop, write nothing more
        self.seen_at: float | None = None  # when the cancellation reached this worker (epoch s)
        self._beat, self._beat_every = beat, beat_every_s
        self._next_beat = time.monotonic() + beat_every_s
        self._buffer: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # the buffer
        self._send = threading.Lock()  # one send at a time, in buffer order
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"job-{job[:8]}", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=2.0)  # subscribed (or Redis is away): a cancel from now on is seen

    def push(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._buffer.append(event)
            self._trim()

    def flush(self) -> None:
        """Send what is buffered now (the caller's thread); RedisError if it cannot."""
        with self._send:
            with self._lock:
                batch, self._buffer = self._buffer, []
            if not batch:
                return
            try:
                self.events.send(self.tenant, self.job, batch)
            except redis.RedisError:
                with self._lock:  # kept, in order, for the next try
                    self._buffer[:0] = batch
                    self._trim()
                raise

    def close(self) -> None:
        """Stop the thread; the events still buffered are sent (best effort)."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        if self._thread.is_alive():  # stuck on a dead connection: it is a daemon, leave it
            log.warning("job %s: event thread did not stop; %d events not sent", self.job, len(self._buffer))
            return
        try:
            self.flush()
        except redis.RedisError:
            pass

    def _trim(self) -> None:
        over = len(self._buffer) - self.events.s.events_maxlen
        if over > 0:
            del self._buffer[:over]

    def _mark(self) -> None:
        if not self.cancelled.is_set():
            self.seen_at = time.time()
            self.cancelled.set()

    def _heartbeat(self) -> None:
        if self._beat is None or time.monotonic() < self._next_beat:
            return
        self._next_beat = time.monotonic() + self._beat_every
        try:
            if self._beat():
                self._mark()
        except ClaimLost:
            self.lost.set()
        except Exception:  # noqa: BLE001 - the database away: the lease holds a while, try again
            log.warning("job %s: lease renewal failed", self.job, exc_info=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            ps = self.events.r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8
            try:
                ps.subscribe(self.events.k.cancel(self.job))
                if self.events.cancelled(self.job):  # asked before we listened
                    self._mark()
                self._ready.set()
                while not self._stop.is_set():
                    if ps.get_message(timeout=FLUSH_S) is not None:
                        self._mark()
                    self.flush()
                    self._heartbeat()
            except redis.RedisError:
                self._ready.set()
                self._heartbeat()  # SQL may be there while Redis is not
                self._stop.wait(0.2)
            finally:
                try:
                    ps.close()
                except redis.RedisError:
                    pass


@dataclass(frozen=True)
class JobServices:
    """What a worker lends each job it runs: its name (routing's affinity), the engine and the
    tokenizer of its model (profile: the model's, beside its weights; None: its default), the
    jobs table, the event streams and the routing; held: whether a tenant is held to its share
    of the workers now (Dispatcher.held; None: never), asked at each turn's start."""

    worker: str
    engine: Engine
    tokenizer: Tokenizer
    jobs: Jobs
    events: JobEvents
    routing: Routing
    profile: Profile | None = None
    held: Callable[[str], bool] | None = None


class JobContext:
    """Turns (workflows/turn.py) over the job's session: turn, used, report; and the job's
    cancellation, lease and step events around each turn."""

    def __init__(self, claim: Claim, services: JobServices, started: float | None = None) -> None:
        """claim: the job as this holder claimed it (its owner token writes its steps).  started:
        when this delivery began (time.monotonic(); default now): the time limits count from it,
        across the delivery's transient retries."""
        assert claim.owner is not None, "a context runs a claimed job"
        job, owner, jobs = claim.job, claim.owner, services.jobs
        self.job = job
        self.owner = owner
        self.worker = services.worker
        self.engine = services.engine
        self.tokenizer = services.tokenizer
        self.cfg: ModelConfig = self.engine.model.cfg
        self.profile = services.profile if services.profile is not None else Profile.for_model(self.cfg, self.tokenizer)
        self.jobs = jobs
        self.events = services.events
        self.routing = services.routing
        self._held = services.held
        self.metrics = TurnMetrics(self.events.r, jobs.s)
        # steps are counted from 0 on every attempt: a step already written (by an earlier
        # attempt) is found by (job, step) and returned as written, so a workflow replays its
        # committed steps without decoding them and resumes at its first uncommitted one
        self.step = 0
        self.progress: dict[str, Any] = dict(job.progress or {})
        self._datasets: dict[str, list[list[str]]] = {}  # read once per attempt
        # the time limits, kept here too: Celery enforces them by signals in a prefork pool
        # process only, and a batching worker runs its jobs on threads.  Past the soft one a step
        # raises TimeLimit; past the hard one the lease is no longer renewed, so that a job whose
        # thread is stuck (no step comes) is requeued by the reaper and finished elsewhere
        t0 = time.monotonic() if started is None else started
        self.deadline = t0 + jobs.s.task_soft_time_limit_s
        hard = t0 + jobs.s.task_time_limit_s
        self.channel = JobChannel(self.events, job.tenant, job.id,
                                  beat=lambda: time.monotonic() < hard and jobs.heartbeat(job.id, owner),
                                  beat_every_s=jobs.s.job_lease_s / 3)

    def close(self) -> None:
        self.channel.close()

    def tick(self, event: dict[str, Any] | None = None) -> None:
        """Once per decode step, no I/O: queue `event` for the stream; stop if the job was
        cancelled, is no longer ours (the channel's thread renews the lease and listens), or ran
        past its time limit."""
        if event is not None:
            self.channel.push({**event, "t": time.time()})  # when the step ended
        if self.channel.lost.is_set():
            raise ClaimLost(f"job {self.job.id}: the lease was lost (requeued to another worker)")
        if self.channel.cancelled.is_set():
            raise Cancelled(f"job {self.job.id} was cancelled (seen at {self.channel.seen_at})")
        if time.monotonic() > self.deadline:
            raise TimeLimit(f"the job ran past {self.jobs.s.task_soft_time_limit_s} s")

    def report(self, **progress: Any) -> None:
        """Workflow progress (sections done, ...): to SQL (what GET and the jobs list show, also
        after the last step) and to the stream (best effort).  A counter never goes back: a
        redelivered job replays its committed steps, and says nothing new until it passes them."""
        old = {k: v for k, v in self.progress.items() if k in progress}
        if any(isinstance(v, int) and isinstance(old.get(k), int) and v < old[k] for k, v in progress.items()):
            return
        self.progress.update(progress)
        self.jobs.step_done(self.job.id, self.owner, int(self.progress.get("steps", 0)), self.progress)
        self._publish({"type": "progress", **progress})

    def checked(self, part: str, outcome: str) -> None:
        """A checked part's outcome, counted for /metrics (best effort, as the turn metrics)."""
        try:
            self.metrics.checked(part, outcome)
        except redis.RedisError:
            pass

    def used(self) -> int:
        """Positions the job's session holds without this job's own turns (a rerun has written
        some already)."""
        return self.engine.records.length(self._session(), self.job.tenant, except_jobs={self.job.id})

    def tool_output(self, call_id: str) -> str | None:
        """The client's output of the call (sent with tool_outputs), as the job row holds it."""
        return (self.job.tool_outputs or {}).get(call_id)

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        """Recorded in the job's row (tool_outputs, beside the client's outputs) under this
        holder's claim, ClaimLost where it is no longer ours; every later attempt reads the row
        from SQL when it claims the job, so it replays the record on whichever worker runs it."""
        return once(key, fn, self.job.tool_outputs or {}, self._record)

    def _record(self, key: str, text: str) -> None:
        self.jobs.keep_output(self.job.id, self.owner, key, text)  # committed before fn's result is used
        self.job.tool_outputs = {**(self.job.tool_outputs or {}), key: text}

    def dataset(self, name: str) -> list[list[str]]:
        if name not in self._datasets:
            self._datasets[name] = Datasets(self.jobs.engine).get(self.job.tenant, name).rows
        return self._datasets[name]

    def _session(self) -> str:
        if self.job.session_id is None:  # the spec check refuses such a job first
            raise BadInput(f"a {self.job.kind!r} job runs on a session")
        return self.job.session_id

    def turn(self, ids: list[int], params: DecodeParams, *, text: str = "", infill: bool = False,
             facts: Slots | None = None) -> TurnResult:
        """One engine turn on the job's session as this job's next step; the step is committed
        (SQL) when it returns.  infill: ids holds mask ids at holes, decoded in place (Engine.turn)."""
        session, step = self._session(), self.step
        self.tick()  # cancelled before it started: nothing to undo
        if step < self.job.step:  # committed by an earlier attempt, as the row's counter says: read back, no lease
            done = self.engine.replay(session, self.job.tenant, ids, JobStep(self.job.id, step, self.owner))
            if done is not None:
                self.step = step + 1
                return done
        result: TurnResult | None = None
        with closing(self.engine.turn(session, self.job.tenant, ids, params, text=text,
                                      job=JobStep(self.job.id, step, self.owner), infill=infill,
                                      priority=self._priority())) as events:
            for ev in events:
                if isinstance(ev, TurnResult):
                    result = ev
                    break
                # pieces: each token's text (a slot's fact written out), so a watcher (the web page)
                # can show it at its position
                pieces = [self.tokenizer.decode([t], skip_special=True) for t in ev.tokens]
                pieces = [facts.lexicalise(x) for x in pieces] if facts is not None else pieces
                self.tick({"type": "step", "turn": step, "step": ev.step, "positions": ev.positions,
                           "tokens": ev.tokens, "pieces": pieces, "cut": ev.cut, "nfe": ev.nfe})
        if result is None:
            raise AssertionError("Engine.turn ends with its TurnResult")
        self.step = step + 1
        if result.path != "done":
            self.progress["tokens"] = self.progress.get("tokens", 0) + len(result.tokens)
        self.progress["steps"] = max(self.step, int(self.progress.get("steps", 0)))
        self.jobs.step_done(self.job.id, self.owner, self.progress["steps"], self.progress)
        try:  # the step is committed: what follows only helps routing, watchers and metrics
            self.routing.touch(session, self.worker)
            if result.path != "done":
                self.metrics.record(self.job.tenant, result.path, result.costs.get("load_s", 0.0),
                                    sum(v for k, v in result.costs.items() if not k.endswith("_est_s")))
            self.channel.flush()  # this turn's step events before its progress event
        except redis.RedisError:
            pass
        self._publish({"type": "progress", **self.progress})
        return result

    def _priority(self) -> str:
        """The batcher's class for this turn: "held" while its tenant is held to its share (its
        steps wait for the other tenants' turns in the batch), else the job's priority."""
        return "held" if self._held is not None and self._held(self.job.tenant) else self.job.priority

    def _publish(self, event: dict[str, Any]) -> None:
        try:
            self.events.publish(self.job.tenant, self.job.id, event)
        except redis.RedisError:
            pass  # events are for watchers; the job's state is in SQL
