"""model/pool.py: the paged KV pool.  A cache holds the blocks of its slots, taken as it grows
(across a block boundary mid-step too) and given back when it leaves, for another cache to
reuse; a fork shares its parent's blocks and the first write to a shared one copies it; a pool
with no free block asks its owner to reclaim one, then refuses clearly.  Decoding over pool
caches gives the tokens and K/V of a plain KVCache, alone and batched."""

from __future__ import annotations

import pytest
import torch

from model.batch import step_batch
from model.decode import begin_turn, commit_pending, decode, prefill, step
from model.kv_cache import KVCache
from model.params import DecodeParams, DecodeState
from model.pool import BLOCK, KVPool, PooledCache, PoolExhausted
from model.transformer import SetDLM
from tests.model.test_batch import Run, Turn, _prompt, assert_same, contexts

P = DecodeParams(policy="set", window=4, tau=0.3, max_new_tokens=24)


def _decoded(model: SetDLM, cache: KVCache, ids: list[int], params: DecodeParams = P,
             context: list[int] | None = None) -> list[int]:
    """A turn of `ids` after the cache's context (the tokens at its positions 0..n-1)."""
    state = begin_turn(model, cache, DecodeState(tokens=list(context)) if context else None, ids, params)
    for _ in decode(model, cache, state, params):
        pass
    commit_pending(model, cache, state)
    return list(state.tokens)


def _same_kv(a: KVCache, b: KVCache) -> None:
    assert a.length == b.length and a.positions == b.positions and a.tokens == b.tokens
    n = a.length
    assert torch.equal(a.k[:, :n], b.k[:, :n]) and torch.equal(a.v[:, :n], b.v[:, :n])


def test_a_cache_holds_the_blocks_of_its_tokens_and_grows_across_a_boundary(model: SetDLM) -> None:
    pool = KVPool(model.cfg, 8)
    cache, ref = pool.take(), KVCache.for_model(model.cfg)
    assert cache.table == [] and pool.held == 0, "an empty cache holds nothing"
    ids = _prompt(torch.Generator().manual_seed(1), BLOCK - 1, model.cfg.vocab_size)
    prefill(model, cache, ids, list(range(len(ids))))
    prefill(model, ref, ids, list(range(len(ids))))
    assert len(cache.table) == 1 and cache.capacity == BLOCK
    # a turn without input: its first step's masks are scratch slots across the boundary
    state, want = (begin_turn(model, c, DecodeState(tokens=list(ids)), [], P) for c in (cache, ref))
    ev = step(model, cache, state, P)
    assert len(cache.table) == 2 and ev.tokens == step(model, ref, want, P).tokens
    for a, b in ((cache, state), (ref, want)):
        for _ in decode(model, a, b, P):
            pass
        commit_pending(model, a, b)
    assert state.tokens == want.tokens and cache.length > BLOCK
    _same_kv(cache, ref)
    cache.trim()
    assert len(cache.table) == -(-cache.length // BLOCK) and pool.held == len(cache.table)
    assert cache.nbytes == len(cache.table) * pool.block_bytes


def test_blocks_given_back_are_reused_and_their_old_contents_change_nothing(model: SetDLM) -> None:
    g = torch.Generator().manual_seed(2)
    first, second = (_prompt(g, n, model.cfg.vocab_size) for n in (20, 9))
    pool = KVPool(model.cfg, 3)  # 48 slots: one cache at a time
    a = pool.take()
    _decoded(model, a, first)
    used = list(a.table)
    pool.give_back(a)
    assert pool.held == 0 and not a.live and a.length == 0
    with pytest.raises(AssertionError):
        pool.give_back(a)
    b = pool.take()
    got = _decoded(model, b, second)
    assert set(b.table) <= set(used) | set(pool.free) and set(b.table) & set(used), "the old blocks again"
    ref = KVCache.for_model(model.cfg)
    assert got == _decoded(model, ref, second)
    _same_kv(b, ref)


def test_a_fork_shares_its_blocks_and_copies_a_shared_one_on_its_first_write(model: SetDLM) -> None:
    g = torch.Generator().manual_seed(3)
    ctx, more = _prompt(g, 2 * BLOCK + 5, model.cfg.vocab_size), _prompt(g, 6, model.cfg.vocab_size)[1:]
    pool = KVPool(model.cfg, 16)
    parent = pool.take()
    prefill(model, parent, ctx, list(range(len(ctx))))
    kept = parent.k[:, : parent.length].clone()
    child = parent.fork(BLOCK + 3)  # mid-block: its last block is the parent's, half written past it
    assert child.table == parent.table[:2] and [pool.ref[b] for b in parent.table] == [2, 2, 1]
    held = pool.held
    got = _decoded(model, child, more, context=ctx[: BLOCK + 3])  # writes slot BLOCK + 3 on: the shared block is copied first
    assert child.table[0] == parent.table[0] and child.table[1] != parent.table[1]
    assert pool.ref[parent.table[0]] == 2 and pool.ref[parent.table[1]] == 1 and pool.held > held
    assert torch.equal(parent.k[:, : parent.length], kept), "the parent's slots are untouched"
    ref = KVCache.for_model(model.cfg)
    prefill(model, ref, ctx, list(range(len(ctx))))
    ref = ref.fork(BLOCK + 3)  # a plain cache's fork: a copy
    assert got == _decoded(model, ref, more, context=ctx[: BLOCK + 3])
    _same_kv(child, ref)
    whole = parent.fork()  # the parent writes next: its shared last block is copied, the fork's stays
    last = parent.table[-1]
    assert pool.ref[last] == 2
    _decoded(model, parent, more, context=ctx)
    assert whole.table[-1] == last and parent.table[-1] != last and pool.ref[last] == 1
    for c in (child, whole, parent):
        pool.give_back(c)
    assert pool.held == 0 and not any(pool.ref)


def test_forks_decode_batched_as_alone(model: SetDLM) -> None:
    """Three forks of one context in one batch: each writes its own copy of the shared block."""
    g = torch.Generator().manual_seed(4)
    ctx = _prompt(g, BLOCK + 7, model.cfg.vocab_size)
    pool = KVPool(model.cfg, 32)
    parent = pool.take()
    prefill(model, parent, ctx, list(range(len(ctx))))
    params = [DecodeParams(policy=p, window=w, tau=0.3, max_new_tokens=20) for p, w in (("set", 4), ("ar", 1), ("prefix", 6))]
    inputs = [_prompt(g, n, model.cfg.vocab_size)[1:] for n in (3, 5, 8)]
    forks = [parent.fork() for _ in params]
    states = [begin_turn(model, c, DecodeState(tokens=list(ctx)), x, p) for c, x, p in zip(forks, inputs, params)]
    while any(not s.done for s in states):
        live = [(c, s, p) for c, s, p in zip(forks, states, params) if not s.done]
        assert not any(isinstance(ev, Exception) for ev in step_batch(model, live))
    for c, s, x, p in zip(forks, states, inputs, params):
        commit_pending(model, c, s)
        ref = KVCache.for_model(model.cfg)
        prefill(model, ref, ctx, list(range(len(ctx))))
        want = begin_turn(model, ref, DecodeState(tokens=list(ctx)), x, p)
        for _ in decode(model, ref, want, p):
            pass
        commit_pending(model, ref, want)
        assert s.tokens == want.tokens
        assert c.positions == ref.positions and c.tokens == ref.tokens
    assert len({c.table[1] for c in forks} | {parent.table[1]}) == 4, "each fork copied the shared block"


def test_a_full_pool_asks_its_owner_then_refuses(model: SetDLM) -> None:
    g = torch.Generator().manual_seed(5)
    pool = KVPool(model.cfg, 2)
    idle = pool.take()
    prefill(model, idle, _prompt(g, BLOCK, model.cfg.vocab_size), list(range(BLOCK)))
    asked: list[int] = []

    def reclaim() -> bool:  # the owner gives the idle cache back, once
        asked.append(1)
        if idle.live:
            pool.give_back(idle)
            return True
        return False

    pool.reclaim = reclaim
    busy = pool.take()
    ids = _prompt(g, 2 * BLOCK, model.cfg.vocab_size)
    prefill(model, busy, ids, list(range(len(ids))))  # needs both blocks: the idle cache's is reclaimed
    assert not idle.live and len(busy.table) == 2 and asked == [1]
    with pytest.raises(PoolExhausted, match="2 blocks of 16 tokens are all held"):
        busy.reserve(1)
    assert busy.length == 2 * BLOCK and len(busy.table) == 2, "a refused growth changes nothing"
    with pytest.raises(AssertionError, match="holds 256 slots"):
        busy.reserve(model.cfg.max_seq_len)


def test_sessions_in_a_pool_with_scattered_blocks_decode_as_alone(model: SetDLM) -> None:
    """Sessions growing side by side take blocks in turn: each one's slots span blocks that are
    not next to each other, and the batch still decodes each sequence as alone."""
    g = torch.Generator().manual_seed(6)
    runs = [Run([Turn(_prompt(g, 4 + 9 * i, model.cfg.vocab_size), DecodeParams(policy="set", window=3, tau=0.3,
                                                                                  max_new_tokens=12 + 5 * i))],
                join=i) for i in range(4)]
    assert_same(model, runs, blocks=contexts(model, 4))


def test_the_pool_counts_what_it_holds(model: SetDLM) -> None:
    pool = KVPool(model.cfg, 10)
    cfg = model.cfg
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    assert pool.block_bytes == BLOCK * per_token and pool.nbytes == 10 * pool.block_bytes
    assert KVPool.of_bytes(cfg, 3 * pool.block_bytes + 1).blocks == 3
    c = pool.take()
    assert isinstance(c, PooledCache) and c.capacity == 0 and c.k.shape == (cfg.n_layers, 0, cfg.n_kv_heads, cfg.head_dim)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (the GPU run: bench/gpu.sh)")
def test_a_restore_writes_cpu_bytes_into_a_gpu_pool(model: SetDLM) -> None:
    """A restore reads segments into CPU tensors; the pool's index_copy_ wants one device."""
    pool = KVPool(model.cfg, 4, device="cuda")
    cache = pool.take()
    cache.reserve(BLOCK + 1)
    src = torch.randn(model.cfg.n_layers, BLOCK + 1, model.cfg.n_kv_heads, model.cfg.head_dim)
    cache.k[:, 0:BLOCK + 1] = src
    assert torch.equal(cache.k[:, 0:BLOCK + 1].cpu(), src)
