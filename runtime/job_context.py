"""What a workflow gets to run a job: the job, the engine, and `turn`, which keeps the job's step
counter so that a redelivered job resumes at its first step not yet committed.

Each turn a job writes is tagged (job id, step) in SQL, uniquely: a step whose turn is already
there (the worker died after writing it, before the job row moved on) is returned as written,
never decoded and appended again.  Every decode step checks for cancellation and queues its step
event, without I/O (runtime/job_channel.py does the Redis side on its own thread); the job's SQL
lease is renewed every third of its length.  A cancelled turn is abandoned before its commit:
the session stays at its last turn.  close() when the attempt ends.
"""

from __future__ import annotations

import time
from contextlib import closing
from typing import Any

from model.decode import DecodeParams
from model.tokenizer import Tokenizer
from runtime.engine import Engine, TurnResult
from runtime.errors import Cancelled
from runtime.events import JobEvents
from runtime.job_channel import JobChannel
from runtime.jobs import Jobs
from runtime.records import JobRecord
from runtime.routing import Routing


class JobContext:
    def __init__(self, job: JobRecord, owner: str, worker: str, engine: Engine, tokenizer: Tokenizer,
                 jobs: Jobs, events: JobEvents, routing: Routing) -> None:
        self.job = job
        self.owner = owner
        self.worker = worker
        self.engine = engine
        self.tokenizer = tokenizer
        self.jobs = jobs
        self.events = events
        self.routing = routing
        self.step = job.step  # steps committed: where a redelivered job resumes
        self.progress: dict[str, Any] = dict(job.progress or {})
        self._beat = time.monotonic()
        self.channel = JobChannel(events, job.id)  # step events out, cancellation in: off this thread

    def close(self) -> None:
        self.channel.close()

    def heartbeat(self) -> None:
        """Renew the job's lease now (ClaimLost if it is no longer ours; Cancelled if asked)."""
        self._beat = time.monotonic()
        if self.jobs.heartbeat(self.job.id, self.owner):
            raise Cancelled(f"job {self.job.id} was cancelled")

    def tick(self, event: dict[str, Any] | None = None) -> None:
        """Once per decode step, no I/O: queue `event` for the stream, stop if cancelled, renew
        the job's SQL lease when due (every third of it)."""
        if event is not None:
            self.channel.push({**event, "t": time.time()})  # when the step ended
        if self.channel.cancelled.is_set():
            raise Cancelled(f"job {self.job.id} was cancelled (seen at {self.channel.seen_at})")
        if time.monotonic() - self._beat > self.jobs.s.job_lease_s / 3:
            self.heartbeat()

    def report(self, **progress: Any) -> None:
        """Workflow progress (sections done, ...): to the stream now, to SQL with the next step."""
        self.progress.update(progress)
        self.events.publish(self.job.id, {"type": "progress", **progress})

    def turn(self, session: str, input_ids: list[int], params: DecodeParams, text: str = "") -> TurnResult:
        """One engine turn as this job's next step; the step is committed (SQL) when it returns."""
        step = self.step
        self.tick()  # cancelled before it started: nothing to undo
        result: TurnResult | None = None
        with closing(self.engine.turn(session, self.job.tenant, input_ids, params, text=text,
                                      job=(self.job.id, step))) as events:
            for ev in events:
                if isinstance(ev, TurnResult):
                    result = ev
                    break
                self.tick({"type": "step", "turn": step, "step": ev.step, "positions": ev.positions,
                           "tokens": ev.tokens, "cut": ev.cut, "nfe": ev.nfe})
        if result is None:
            raise AssertionError("Engine.turn ends with its TurnResult")
        self.routing.touch(session, self.worker)
        self.step = step + 1
        self.progress.update(steps=self.step, tokens=self.progress.get("tokens", 0) + len(result.tokens))
        self.jobs.step_done(self.job.id, self.owner, self.step, self.progress)
        self._beat = time.monotonic()
        self.events.publish(self.job.id, {"type": "progress", **self.progress})
        return result
