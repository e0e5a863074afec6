"""The engine's warm sessions in a paged pool (runtime/sessions/engine.py over model/pool.py): a
warm entry replaced under a reused id gives its blocks back; a worker's pool holds its batch of
whole contexts.  The engines are test_batcher.py's (its make_engine fixture)."""

from __future__ import annotations

from collections.abc import Callable

from model.pool import KVPool
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.sessions.engine import Engine
from tests.runtime.sessions import test_batcher as batcher

loaded, make_engine = batcher.loaded, batcher.make_engine  # its fixtures, used here by name
_context, _turns = batcher._context, batcher._turns


def test_a_warm_entry_replaced_under_a_reused_id_gives_its_blocks_back(make_engine: Callable[..., Engine],
                                                                       loaded: tuple[SetDLM, Tokenizer]) -> None:
    """A session id deleted elsewhere and used again here (a fork under that id) replaces the
    warm entry: the blocks of the entry it replaces go back to the pool, not out of it for good."""
    tok = loaded[1]
    e = make_engine(rows=2)
    assert e.pool is not None
    free = len(e.pool.free)
    first, _, params = _turns(tok, 0)
    sid = e.open("acme")
    e.run_turn(sid, "acme", first, params)
    held = free - len(e.pool.free)
    assert held > 0 and sid in e.warm
    other = e.open("acme")
    e.run_turn(other, "acme", first, params)
    with e._rows:
        replacement = e.warm.pop(other)
    e._keep_warm(sid, replacement)  # the id's entry is replaced by another cache
    assert len(e.pool.free) == free - held, "the replaced entry's blocks are back; the new one's held"



def test_a_workers_pool_holds_its_batch_of_whole_contexts(loaded: tuple[SetDLM, Tokenizer]) -> None:
    """A worker sizes its pool in blocks: batch_sessions whole contexts at least, however the
    context divides into blocks, so every turn it admits can reach its context's end."""
    assert KVPool.of_bytes(loaded[0].cfg, 1, contexts=3).blocks == 3 * _context(loaded[0])
