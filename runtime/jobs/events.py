"""A job's events in Redis: one stream per job, and its cancellation flag.

Every entry has one field, `data`, a JSON object with a `type`:

    {"type": "status", "status": "queued" | "running" | "succeeded" | ..., ...}
    {"type": "step", "turn": 0, "step": 3, "positions": [..], "tokens": [..], "cut": null, "nfe": 4,
     "t": 1795000000.123}                   (t: when the step ended, epoch seconds)
    {"type": "progress", ...}               what a workflow reports (tokens, sections done)
    {"type": "cancel_requested"}

The stream is trimmed to Settings.events_maxlen entries and expires events_ttl_s after its last
event.  A worker sends step events in batches, every FLUSH_S (runtime/jobs/context.py JobChannel).

A tenant's streams are in its byte account (runtime/sessions/streams.py StreamAccount, which
JobEvents is): each write sets its stream's size there, and a tenant at its quota has its
submissions refused.
Cancellation is a flag `{p}:cancel:{job}` (read when a job starts) and a message published on a
channel of the same name (heard by the worker running the job).
Task messages that name no job go to a dead-letter stream, with the reason.
A reader (an SSE stream, a response's wait) follows a job with follow(): its events as they come,
and its row at a terminal status event and every CHECK_S, until the row has ended.

Compaction.  A job that has ended (ended()) is due, events_compact_after_s later, for compaction
by the reaper (compact_due): its stream keeps its status events, cancel_requested and its last
progress; its step events go, by XDEL, which keeps the other entries' ids (a client's
Last-Event-ID still finds its place) and allocates nothing (it works at maxmemory too).  The
wait lets a watcher a little behind read every step first.  EXCEPT a response's stream (kind
"response"): GET /v1/responses/{id}?stream=true&starting_after=N replays it from its start
through runtime/api/openai/stream.Translator, numbering the events it derives as it goes, so a
compacted stream would renumber them; it is kept whole, bounded by the quota and its TTL.
A deleted session's jobs' streams go in bounded batches (drop(): DROP_BATCH keys per DEL, one
script call per DROP_BATCH jobs).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from runtime.replies import text as _text
from runtime.sessions.streams import DROP_BATCH, SWEEP_BATCH, SWEEP_S, StreamAccount, _who
from runtime.tables import TERMINAL, JobRecord

FLUSH_S = 0.03  # step events wait at most this long in a worker's buffer
PAGE = 1000  # entries read per XRANGE while a stream is compacted
RESPONSE = "response"  # the job kind whose stream is never compacted (see the module's note)
FINAL = ("status", "cancel_requested")  # what compaction keeps (with the last progress event)
CHECK_S = 1.0  # a follower reads the job's row at least this often (and its stream's reads block this long)
Followed = tuple[str, dict[str, Any]] | JobRecord | None  # what follow() yields: an event, the row, a quiet spell


class JobEvents(StreamAccount):
    def publish(self, tenant: str, job: str, data: dict[str, Any]) -> None:
        """A status, progress or cancel event; the stream's bytes counted now."""
        self.send(tenant, job, [data], count_every_s=0.0)

    def publish_many(self, tenant: str, events: list[tuple[str, dict[str, Any]]]) -> None:
        """publish() for many new jobs of the tenant at once (a schedule pass's first status
        events: job id, event): their streams in one round trip, their accounts in one more."""
        wrote = self._append([(job, [data]) for job, data in events])
        self._count_made(tenant, [(job, used) for (job, _), (_, used) in zip(events, wrote, strict=True)])

    def send(self, tenant: str, job: str, batch: list[dict[str, Any]], count_every_s: float = 1.0) -> None:
        """Events of the tenant's job (step events: a batch) in one round trip; the stream
        expires events_ttl_s after the last batch.  Its bytes are counted in the tenant's
        account at most every count_every_s (the account lags a running job's stream by up
        to that much: its last event is a status, published and counted at once)."""
        (length, used), = self._append([(job, batch)])
        # a stream holding only this batch was made by it: also one deleted (its session was) and
        # forgotten since this process last put it in events_due, which must hear of it again
        if length <= len(batch):
            self._count_made(tenant, [(job, used)])
        else:
            self._count(tenant, job, used, count_every_s)

    def _append(self, streams: list[tuple[str, list[dict[str, Any]]]]) -> list[tuple[int, int]]:
        """Append each job's events to its stream, in one round trip: (its length, its bytes)
        after, per job."""
        with self.r.pipeline(transaction=False) as p:
            for job, batch in streams:
                key = self.k.events(job)
                for data in batch:
                    p.xadd(key, {"data": json.dumps(data)}, maxlen=self.s.events_maxlen, approximate=True)
                p.expire(key, self.s.events_ttl_s)  # never a stream without a TTL
                p.xlen(key)
                p.memory_usage(key)  # its size after trimming (one key: one slot, on a cluster too)
            replies = p.execute()
        out, i = [], 0
        for _, batch in streams:
            i += len(batch) + 1  # its XADDs and EXPIRE
            out.append((int(replies[i]), int(replies[i + 1] or 0)))
            i += 2
        return out

    def drop(self, tenant: str, jobs: list[str]) -> None:
        """Delete the jobs' streams and cancellation flags (their session is deleted) and take
        them out of the tenant's account: at most DROP_BATCH keys per DEL, never one command
        over all of a session's jobs."""
        keys = [key for j in jobs for key in (self.k.events(j), self.k.cancel(j))]
        for i in range(0, len(keys), DROP_BATCH):
            self.r.delete(*keys[i:i + DROP_BATCH])
        self.forget(tenant, jobs)

    def ended(self, tenant: str, job: str, kind: str) -> None:
        """The job has ended: its stream is due for compaction events_compact_after_s from now
        (compact_due), unless it is a response's, which is kept whole (the module's note)."""
        if kind == RESPONSE:
            return
        due = int((time.time() + self.s.events_compact_after_s) * 1000)
        self.r.zadd(self.k.events_done, {json.dumps([tenant, job]): due})

    def never_ran(self, tenant: str, job: str, kind: str) -> None:
        """A job that ended before it ever ran (cancelled while queued): its stream holds status
        events only, and its row holds its end, so the stream expires events_compact_after_s
        from now (a watcher reads the end first) and is due for the sweep then, not kept a day.
        A response's is kept whole, as ended() keeps it."""
        if kind == RESPONSE:
            return
        after = max(1.0, self.s.events_compact_after_s)
        member = json.dumps([tenant, job])
        with self.r.pipeline(transaction=False) as p:
            p.expire(self.k.events(job), int(math.ceil(after)))
            p.expire(self.k.cancel(job), int(math.ceil(after)))
            p.zadd(self.k.events_due, {member: int((time.time() + after) * 1000)})
            p.zrem(self.k.events_done, member)
            p.execute()
        self._seen.pop(job, None)

    def compact(self, tenant: str, job: str) -> int:
        """The ended job's stream keeps its final events: its status events, cancel_requested and
        its last progress (the others' ids unchanged: XDEL); it is counted again in the tenant's
        account.  Read PAGE entries at a time.  Returns the entries deleted."""
        key = self.k.events(job)
        drop: list[str] = []
        progress: str | None = None  # the last progress event seen: kept
        after = "-"
        while True:
            page: Any = self.r.xrange(key, after, "+", count=PAGE)
            for eid, fields in page:
                eid = _text(eid)
                kind = _kind(fields)
                if kind == "progress":
                    if progress is not None:
                        drop.append(progress)
                    progress = eid
                elif kind not in FINAL:
                    drop.append(eid)
            if len(page) < PAGE:
                break
            after = f"({_text(page[-1][0])}"
        for i in range(0, len(drop), DROP_BATCH):
            self.r.xdel(key, *drop[i:i + DROP_BATCH])
        self._set_bytes(tenant, [(job, int(self.r.memory_usage(key) or 0))])
        self._seen.pop(job, None)
        return len(drop)

    def compact_due(self, batch: int = SWEEP_BATCH, budget_s: float = SWEEP_S) -> dict[str, int]:
        """The ended jobs' streams whose compaction is due, the oldest first, until none is due
        or budget_s has passed (the reaper's pass).  Returns {"event_streams_compacted": n}."""
        done, started = 0, time.monotonic()
        while time.monotonic() - started < budget_s:
            due: Any = self.r.zrangebyscore(self.k.events_done, "-inf", int(time.time() * 1000), start=0, num=batch)
            if not due:
                break
            for raw in due:
                who = _who(raw)
                if who is not None:  # else not ours to read: dropped
                    self.compact(*who)
                    done += 1
                self.r.zrem(self.k.events_done, raw)
                if time.monotonic() - started >= budget_s:
                    break
        return {"event_streams_compacted": done}

    def request_cancel(self, tenant: str, job: str) -> None:
        """The flag (for a worker that starts the job later) and a message on the same name (for
        the worker running it now: runtime/jobs/context.py JobChannel)."""
        with self.r.pipeline(transaction=False) as p:
            p.set(self.k.cancel(job), 1, ex=self.s.events_ttl_s)
            p.publish(self.k.cancel(job), 1)
            p.execute()
        self.publish(tenant, job, {"type": "cancel_requested"})

    def cancelled(self, job: str) -> bool:
        return bool(self.r.exists(self.k.cancel(job)))

    def read(self, job: str, after: str = "0", block_ms: int | None = None, count: int = 1000
             ) -> list[tuple[str, dict[str, Any]]]:
        """Events after stream id `after` (oldest first), waiting up to block_ms for one."""
        return entries(self.r.xread({self.k.events(job): after}, count=count, block=block_ms))

    async def follow(self, r: aioredis.Redis, job: str, row: Callable[[], Awaitable[JobRecord]], after: str = "0",
                     keepalive_s: float = math.inf) -> AsyncGenerator[Followed, None]:
        """The job's events after stream id `after` as (event id, event), and its row (`row()`)
        at a terminal status event and every CHECK_S, until the row has ended: then the rest of
        the stream, that row, and the end (events are best effort; SQL is the truth).  None where
        keepalive_s went by without an event.  It waits on `r`, an async client the caller
        owns, holding no thread; a failed read is tried again half a second later."""
        key = self.k.events(job)
        quiet = checked = time.monotonic()
        while True:
            try:
                got = entries(await r.xread({key: after}, count=1000, block=int(CHECK_S * 1000)))
            except redis.RedisError:
                got = []
                await asyncio.sleep(0.5)
            ended = False
            for eid, ev in got:
                after, quiet = eid, time.monotonic()
                yield eid, ev
                ended = ended or (ev.get("type") == "status" and ev.get("status") in TERMINAL)
            now = time.monotonic()
            if ended or now - checked >= CHECK_S:
                checked = now
                rec = await row()
                if rec.status in TERMINAL:
                    try:  # what the stream holds that this read has not reached yet comes first
                        rest = entries(await r.xread({key: after}, count=100_000))
                    except redis.RedisError:
                        rest = []
                    for eid_ev in rest:
                        yield eid_ev
                    yield rec
                    return
                yield rec
            if now - quiet >= keepalive_s:
                quiet = now
                yield None

    def dead_letter(self, task_id: str, payload: Any, code: str, message: str) -> None:
        self.r.xadd(self.k.dead, {"data": json.dumps({"task_id": task_id, "payload": repr(payload)[:500],
                                                      "code": code, "message": message, "at": time.time()})},
                    maxlen=self.s.events_maxlen, approximate=True)


def _kind(fields: Any) -> str | None:
    """An entry's event type (None: unreadable, kept as it is)."""
    try:
        event = json.loads(fields[b"data"] if b"data" in fields else fields["data"])
    except (KeyError, ValueError, TypeError):
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    return kind if isinstance(kind, str) else None


def entries(got: Any) -> list[tuple[str, dict[str, Any]]]:
    """An XREAD reply (sync or async client) as (event id, event), oldest first."""
    out = []
    for _key, items in got or []:
        for eid, fields in items:
            out.append((_text(eid), json.loads(fields[b"data"] if b"data" in fields else fields["data"])))
    return out
