"""TurnWriter: a turn's K/V on their way to Redis.  While the turn decodes, full batches of new
slots go to the write-behind; once the turn's SQL row is written, save() commits the rest and
the manifest's new state under the turn's lease.  Knows nothing of SQL or of how a turn decodes.

A stop that rolls back slots already handed to the write-behind (their positions reach past the
cut) makes those segments wrong: the turn's slots are then all written again by save().  The
decoder may run ahead of the writer (a batcher steps a turn while its thread handles earlier
events): add() copies no slot past its event's cache length, and a rollback that came after
its event (the cache's rollback count moved past the event's) spoils what it copied in the same
way.
"""

from __future__ import annotations

from dataclasses import replace
from types import TracebackType
from typing import Any

import redis

from model.decode import StepEvent
from model.kv_cache import KVCache
from model.params import DecodeState
from runtime.errors import SetflowError
from runtime.sessions import kv
from runtime.sessions.lease import Held
from runtime.sessions.state import turn_state
from runtime.sessions.store import Manifest, SessionStore
from runtime.sessions.writebehind import WriteBehind


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
