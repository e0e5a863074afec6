"""TurnWriter: a turn's K/V on their way to Redis.  While the turn decodes, full batches of new
slots go to the write-behind; once the turn's SQL row is written, save() commits the rest and
the manifest's new state under the turn's lease.  Knows nothing of SQL or of how a turn decodes.

A stop that rolls back slots already handed to the write-behind (their positions reach past the
cut) makes those segments wrong: the turn's slots are then all written again by save().  The
decoder may run ahead of the writer (a batcher steps a turn while its thread handles earlier
events): add() copies no slot past its event's cache length, and a rollback that came after
its event (the cache's rollback count moved past the event's) spoils what it copied in the same
way.

WriteBehind: a turn's committed K/V go to Redis while the turn is still decoding.  The decoding
thread hands over slot ranges as segment bytes (a bounded queue: when Redis falls behind,
decoding waits rather than buffering without limit); one writer thread puts them and advances
the manifest by compare-and-set under the turn's lease, naming them as `behind`.  The manifest's
state (what a restore reads) stays the last completed turn's until the turn commits, so an
interrupted turn that started warm or restored leaves that turn restorable (one that started by
recomputing leaves the session to recompute again); the next commit of the session releases what
was written behind.  A write that fails (budget, lease, anything) stops the write-behind; the
turn's final save then writes the turn's slots again.  A write Redis refused at its maxmemory
(OOM) is first tried again for up to OOM_RETRY_S: memory frees as the reaper evicts sessions and
compacts or expires streams."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from types import TracebackType
from typing import Any

import redis

from model.decode import StepEvent
from model.kv_cache import KVCache
from model.params import DecodeState
from runtime.errors import SetflowError
from runtime.sessions import kv
from runtime.sessions.budget import oom
from runtime.sessions.lease import Held, Lease
from runtime.sessions.store import Manifest, SessionStore, turn_state

OOM_RETRY_S = 5.0  # a batch refused at maxmemory is tried again this long (the lease lasts lease_ms)


class WriteBehind:
    def __init__(self, store: SessionStore, base: Manifest, lease: Lease, max_queue: int = 4) -> None:
        self.store = store
        self.lease = lease
        self.manifest = base  # the latest stored manifest (generation included)
        self.error: Exception | None = None
        self._q: queue.Queue[list[bytes] | None] = queue.Queue(max_queue)
        self._thread = threading.Thread(target=self._run, name="setflow-write-behind", daemon=True)
        self._thread.start()

    def submit(self, blobs: list[bytes]) -> None:
        """Queue segments for writing (blocks while the queue is full)."""
        if self.error is None and blobs:
            self._q.put(blobs)

    def close(self) -> Manifest:
        """Wait for every queued write; returns the latest stored manifest."""
        self._q.put(None)
        self._thread.join()
        return self.manifest

    def _run(self) -> None:
        while True:
            blobs = self._q.get()
            if blobs is None:
                return
            if self.error is not None:
                continue  # stopped: drain without writing
            try:
                self._write(blobs)
            except Exception as e:  # noqa: BLE001 - any failure stops the write-behind, never the thread:
                self.error = e  # a dead writer would leave the decoding blocked on the full queue

    def _write(self, blobs: list[bytes]) -> None:
        """Put the batch, then name it in the manifest; each step tried again while Redis refuses
        it at its maxmemory, for up to OOM_RETRY_S (backoff 0.05 s doubling to 1 s)."""
        deadline, delay = time.monotonic() + OOM_RETRY_S, 0.05
        ids: list[str] | None = None
        while True:
            try:
                if ids is None:
                    ids = self.store.put_segments(self.manifest.session, self.manifest.tenant, blobs)
                m = replace(self.manifest, behind=self.manifest.behind + ids)
                self.manifest = self.store.commit(m, self.lease)
                return
            except Exception as e:
                if not oom(e) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)


class TurnWriter:
    """`with TurnWriter(...) as writer:` around the decode loop (add() per step; the exit waits for
    the write-behind), then writer.save() after the SQL row.

    stored: the session's manifest as read under the lease; reuse: its segments hold this turn's
    starting cache (restored from them, or warm at its very turn count and length): the turn's
    writes then start from them, else from a manifest that names none and is not restorable
    (turns -1) until the turn commits, at the stored generation.  batch: slots per write-behind
    batch (0: the turn is written at its end only)."""

    def __init__(self, store: SessionStore, lease: Held, tenant: str, fingerprint: str, stored: Manifest | None,
                 reuse: bool, batch: int) -> None:
        self.store, self.lease, self.fp, self.batch = store, lease, fingerprint, batch
        if reuse and stored is not None:
            self.base = replace(stored, behind=[])
        else:
            self.base = Manifest(lease.session, tenant, fingerprint, stored.gen if stored is not None else 0,
                                 state={"turns": -1})
        self.latest = self.base  # the latest stored manifest (the write-behind advances it)
        self.written = self.base.slots  # slots handed to the write-behind
        self.top = -1  # their highest position
        self.cut = False  # a stop rolled some of them back (or may have, while they were copied)
        self._behind = WriteBehind(store, self.base, lease.lease) if batch else None
        self._open = self._behind is not None

    def __enter__(self) -> TurnWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Wait for every queued write (the write-behind's thread ends)."""
        if self._behind is not None and self._open:
            self._open = False
            self.latest = self._behind.close()

    def add(self, cache: KVCache, ev: StepEvent) -> None:
        """After a step: the slots committed since the last batch go to the write-behind once
        there are `batch` of them."""
        # a stop drops positions >= ev.cut and rolls the cache back to the first slot holding
        # one: slots handed over stay valid iff all their positions are below it
        self.cut = self.cut or (ev.cut is not None and self.top >= ev.cut)
        if self._behind is None or self.cut or ev.length - self.written < self.batch:
            return
        blobs = self._segments(cache, self.written, ev.length)
        top = int(cache.pos[self.written:ev.length].max())
        if cache.rollbacks != ev.rollbacks:  # the decoder, ahead of this event, rolled back: these slots may have changed
            self.cut = True
            return
        self._behind.submit(blobs)
        self.top = max(self.top, top)
        self.written = ev.length

    def save(self, cache: KVCache, state: DecodeState, params: dict[str, Any], turns: int) -> list[str]:
        """The turn's commit in Redis (after close()): the segments of slots [0, base.slots) as
        they were, then those written behind (unless a cut or a failure spoiled them), then the
        rest; the manifest's state becomes this turn's.  Returns what went wrong, as events: the
        turn is durable in SQL already, so a failed save only costs a recompute elsewhere."""
        events = []
        wb = self._behind
        kept = wb is not None and wb.error is None and not self.cut
        written, behind = (self.written, self.latest.behind) if kept else (self.base.slots, [])
        try:
            rest = self._put(cache, written) if cache.length > written else []
            body = turn_state(state, params, cache.positions, cache.tokens, turns)
            new = replace(self.latest, segments=self.latest.segments + behind + rest, slots=cache.length, state=body,
                          behind=[])
            self.store.commit(new, self.lease.lease)
        except (SetflowError, redis.RedisError) as e:
            events.append(f"redis save failed ({e}): the next turn here is warm, elsewhere recomputed")
        if wb is not None and wb.error is not None:
            events.append(f"write-behind stopped ({wb.error}): the turn was written at its end")
        return events

    def _segments(self, cache: KVCache, start: int, end: int) -> list[bytes]:
        """Slots [start, end) of the cache as segment bytes."""
        return kv.to_segments(cache, start, end, self.fp, self.store.s.segment_bytes)

    def _put(self, cache: KVCache, start: int) -> list[str]:
        return self.store.put_segments(self.base.session, self.base.tenant, self._segments(cache, start, cache.length))
