"""runtime/sessions/writer.py against a real Redis server: what the write-behind hands over while
the decoder runs ahead of it (a batcher), and what a rollback it did not see coming spoils."""

from __future__ import annotations

import redis
import torch

from model.decode import StepEvent, prefill
from model.kv_cache import KVCache
from model.params import DecodeState
from runtime.sessions import kv
from runtime.sessions.store import SessionStore, read_state
from runtime.sessions.writer import TurnWriter
from runtime.settings import Settings
from tests.fakes import random_model

FP = "0123456789abcdef"


def _event(cache: KVCache, length: int, cut: int | None = None, rollbacks: int | None = None) -> StepEvent:
    """What the decoder reported after a step: the cache's length then, and its rollback count
    then (by default: now)."""
    return StepEvent(0, [], [], [], 1, cut is not None, cut=cut, length=length,
                     rollbacks=cache.rollbacks if rollbacks is None else rollbacks)


def test_the_writer_copies_no_slot_past_its_event_and_a_rollback_it_did_not_see_spoils_its_copies(
        client: redis.Redis, settings: Settings) -> None:
    model = random_model(0)
    g = torch.Generator().manual_seed(0)
    ids = [2] + torch.randint(4, model.cfg.vocab_size, (23,), generator=g).tolist()
    cache = KVCache.for_model(model.cfg)
    prefill(model, cache, ids[:8], list(range(8)))
    store = SessionStore(client, settings)
    with store.lease("s1") as lease:
        with TurnWriter(store, lease, "acme", FP, None, False, 2) as w:
            prefill(model, cache, ids[8:14], list(range(8, 14)))  # the decoder, ahead of the writer
            w.add(cache, _event(cache, 12))
            assert (w.written, w.cut) == (12, False), "up to the event's length, not the cache's"
            before = cache.rollbacks  # the next event was reported before ...
            cache.rollback(10)  # ... the decoder cut while the writer was behind it: slots 10.. change
            prefill(model, cache, ids[10:16], list(range(10, 16)))
            w.add(cache, _event(cache, 14, rollbacks=before))
            assert w.cut and w.written == 12, "copies made across a rollback are never handed over"
            w.add(cache, _event(cache, 16))
            assert w.written == 12
        events = w.save(cache, DecodeState(tokens=ids[:16]), {}, 1)
    assert events == []
    m = store.read("s1")
    assert m is not None and m.slots == 16
    _, positions, tokens = read_state(m.state)
    back = kv.from_segments(store.get_segments(m.segments), FP, positions, tokens)
    assert torch.equal(back.k[:, :16], cache.k[:, :16]) and torch.equal(back.v[:, :16], cache.v[:, :16])


def test_a_cut_the_writer_sees_in_order_keeps_what_it_handed_over_below_the_cut(
        client: redis.Redis, settings: Settings) -> None:
    model = random_model(0)
    cache = KVCache.for_model(model.cfg)
    prefill(model, cache, [2, 5, 6, 7, 8, 9], list(range(6)))
    store = SessionStore(client, settings)
    with store.lease("s2") as lease:
        with TurnWriter(store, lease, "acme", FP, None, False, 1) as w:
            w.add(cache, _event(cache, 6))
            prefill(model, cache, [10, 11], [8, 6])  # a set decoded out of order, committed
            # the step that cuts at 7 (model/decode.py truncate): back to the slot of position 8,
            # the valid later slot committed again
            cache.rollback(6)
            prefill(model, cache, [11], [6])
            w.add(cache, _event(cache, 7, cut=7))
            assert not w.cut and w.written == 7, "this event's own rollback spoils nothing"
