"""What a workflow gets to run a job: the Turns seam (workflows/turn.py) over the job's session,
whose `turn` keeps the job's step counter so that a redelivered job resumes at its first step
not yet committed.

Each turn a job writes is tagged (job id, step) in SQL, uniquely: a step whose turn is already
there (the worker died after writing it, before the job row moved on) is returned as written,
never decoded and appended again.  Every decode step checks for cancellation and queues its step
event, without I/O (runtime/jobs/channel.py does the Redis side on its own thread); the job's SQL
lease is renewed every third of its length.  A cancelled turn is abandoned before its commit:
the session stays at its last turn.  close() when the attempt ends.
"""

from __future__ import annotations

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
from runtime.jobs.channel import JobChannel
from runtime.jobs.datasets import Datasets
from runtime.jobs.events import JobEvents
from runtime.jobs.metrics import TurnMetrics
from runtime.jobs.routing import Routing
from runtime.jobs.rows import Claim, Jobs
from runtime.sessions.engine import Engine
from runtime.sessions.once import once
from runtime.sessions.records import JobStep
from runtime.sessions.turn import TurnResult


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
