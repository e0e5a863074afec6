"""A running job's link to the outside, kept off the decode loop: one thread per running job
- sends the step events the loop buffers, every FLUSH_S (one pipelined write);
- listens for the job's cancellation (pub/sub: it arrives within a round trip of being asked);
- renews the job's SQL lease every third of job_lease_s (also while the session loads, waits for
  its lease or recomputes), and learns there of a cancellation or of a lost claim.
The loop itself does no I/O per step: it appends an event and reads two flags.  Measured: a
synchronous per-step Redis round trip made the shipped model's decoding 17% slower on these
2-core machines (docs/BENCHMARKS.md); this costs nothing measurable.

If Redis goes away the thread keeps trying (every 0.2 s) and subscribes again; events buffered
meanwhile are sent when it is back (at most events_maxlen of them: the oldest are dropped).
Sends happen under one lock, so the stream keeps the order in which events were buffered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from runtime.errors import ClaimLost
from runtime.jobs.events import FLUSH_S, JobEvents

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
