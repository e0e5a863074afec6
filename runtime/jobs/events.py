"""A job's events in Redis: one stream per job, and its cancellation flag.

Every entry has one field, `data`, a JSON object with a `type`:

    {"type": "status", "status": "queued" | "running" | "succeeded" | ..., ...}
    {"type": "step", "turn": 0, "step": 3, "positions": [..], "tokens": [..], "cut": null, "nfe": 4,
     "t": 1795000000.123}                   (t: when the step ended, epoch seconds)
    {"type": "progress", ...}               what a workflow reports (tokens, sections done)
    {"type": "cancel_requested"}

The stream is trimmed to Settings.events_maxlen entries and expires events_ttl_s after its last
event.  A worker sends step events in batches, every FLUSH_S (runtime/jobs/channel.py).
Cancellation is a flag `{p}:cancel:{job}` (read when a job starts) and a message published on a
channel of the same name (heard by the worker running the job).
Task messages that name no job go to a dead-letter stream, with the reason.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from runtime.keys import Keys
from runtime.settings import Settings

FLUSH_S = 0.03  # step events wait at most this long in a worker's buffer


class JobEvents:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.r = client
        self.s = settings
        self.k = Keys(settings.key_prefix)

    def publish(self, job: str, data: dict[str, Any]) -> None:
        key = self.k.events(job)
        with self.r.pipeline(transaction=False) as p:
            p.xadd(key, {"data": json.dumps(data)}, maxlen=self.s.events_maxlen, approximate=True)
            p.expire(key, self.s.events_ttl_s)
            p.execute()

    def send(self, job: str, batch: list[dict[str, Any]]) -> None:
        """Step events, in one round trip; the stream expires events_ttl_s after the last batch."""
        with self.r.pipeline(transaction=False) as p:
            for data in batch:
                p.xadd(self.k.events(job), {"data": json.dumps(data)}, maxlen=self.s.events_maxlen, approximate=True)
            p.expire(self.k.events(job), self.s.events_ttl_s)  # never a stream without a TTL
            p.execute()

    def request_cancel(self, job: str) -> None:
        """The flag (for a worker that starts the job later) and a message on the same name (for
        the worker running it now: runtime/jobs/channel.py)."""
        with self.r.pipeline(transaction=False) as p:
            p.set(self.k.cancel(job), 1, ex=self.s.events_ttl_s)
            p.publish(self.k.cancel(job), 1)
            p.execute()
        self.publish(job, {"type": "cancel_requested"})

    def cancelled(self, job: str) -> bool:
        return bool(self.r.exists(self.k.cancel(job)))

    def read(self, job: str, after: str = "0", block_ms: int | None = None, count: int = 1000
             ) -> list[tuple[str, dict[str, Any]]]:
        """Events after stream id `after` (oldest first), waiting up to block_ms for one."""
        return entries(self.r.xread({self.k.events(job): after}, count=count, block=block_ms))

    def dead_letter(self, task_id: str, payload: Any, code: str, message: str) -> None:
        self.r.xadd(self.k.dead, {"data": json.dumps({"task_id": task_id, "payload": repr(payload)[:500],
                                                      "code": code, "message": message, "at": time.time()})},
                    maxlen=self.s.events_maxlen, approximate=True)


def entries(got: Any) -> list[tuple[str, dict[str, Any]]]:
    """An XREAD reply (sync or async client) as (event id, event), oldest first."""
    out = []
    for _key, items in got or []:
        for eid, fields in items:
            out.append((_text(eid), json.loads(fields[b"data"] if b"data" in fields else fields["data"])))
    return out


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
