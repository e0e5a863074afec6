"""Infill regions (begin_infill, begin_infill_turn), invariant I14 of the reference note (section
6.2): holes filled in place, context kept, cached equals uncached and one causal prefill, a
refused infill turn changes nothing."""

import copy

import pytest
import torch

from model.decode import begin_infill, begin_infill_turn, begin_turn, commit_pending, decode, step
from model.kv_cache import KVCache
from model.params import DecodeError, DecodeParams, DecodeState
from model.policy import active_positions
from model.transformer import SetDLM
from tests.fakes import PROMPT, assert_same_cache, uncached_logits
from tests.model.reference import ATOL, assert_close_cache, fresh, prefill_reference


@pytest.mark.parametrize("W,tau", [(1, None), (4, 0.2), (8, 0.0)])
def test_I14_infill_fills_holes_and_keeps_context(model: SetDLM, W: int, tau: float | None) -> None:
    M = model.cfg.mask_id
    text = [2, 20, 21, M, M, M, 22, 23, M, M, 24, 25, M, 26]
    params = DecodeParams(policy="set", window=W, tau=tau, max_new_tokens=0)
    cache = fresh(model)
    state = begin_infill(model, cache, text)
    order = []
    while not state.done:
        active = active_positions(state, params, M)
        ref = uncached_logits(model, cache, state, active)
        ev = step(model, cache, state, params)
        torch.testing.assert_close(ev.logits, ref, atol=ATOL, rtol=0)
        order += ev.positions
    holes = [p for p, t in enumerate(text) if t == M]
    assert len(state.tokens) == len(text), "positions never shift"
    assert all(state.tokens[p] == t for p, t in enumerate(text) if t != M), "context unchanged"
    assert M not in state.tokens and sorted(order) == holes
    if W == 1:
        assert order == holes, "W = 1 fills the holes strictly left to right"
    commit_pending(model, cache, state)
    assert_close_cache(cache, prefill_reference(model, cache))


def _infill_input(model: SetDLM) -> list[int]:
    """A turn's input with holes: context on both sides of each, a hole at its last position."""
    M = model.cfg.mask_id
    return [30, 31, M, M, M, 32, 33, M, M, 34, 35, M]


@pytest.mark.parametrize("params", [DecodeParams(policy="set", window=4, tau=0.2, max_new_tokens=16),
                                    DecodeParams(policy="set", window=8, tau=0.0, max_new_tokens=16),
                                    DecodeParams(policy="prefix", window=6, tau=0.15, max_new_tokens=16),
                                    DecodeParams(policy="ar", max_new_tokens=16)])
def test_infill_turn_after_a_turn_cached_equals_uncached_and_one_prefill(model: SetDLM,
                                                                         params: DecodeParams) -> None:
    """An infill region appended to a session (the previous turn's pending set fused into its
    context's prefill): cached logits equal the uncached forward at every step, the whole
    use_cache=False path gives the same tokens and cache, and the cache is one causal prefill
    of its commit order (so the engine's recompute rebuilds it)."""
    M, text = model.cfg.mask_id, _infill_input(model)

    def run(use_cache: bool) -> tuple[KVCache, DecodeState, list[int]]:
        p = copy.deepcopy(params)
        p.use_cache = use_cache
        cache = fresh(model)
        state = begin_turn(model, cache, None, PROMPT, p)
        list(decode(model, cache, state, p))
        n0, pending = len(state.tokens), list(state.pending)
        assert pending, "this test fuses a pending set into the infill prefill"
        state = begin_infill_turn(model, cache, state, text, p)
        assert not state.pending and state.infill and not state.done
        assert set(pending) <= set(cache.positions), "the previous turn's pending set is committed"
        assert state.start == n0 + text.index(M) and len(state.tokens) == n0 + len(text)
        order: list[int] = []
        while not state.done:
            active = active_positions(state, p, M)
            ref = uncached_logits(model, cache, state, active)
            ev = step(model, cache, state, p)
            torch.testing.assert_close(ev.logits, ref, atol=ATOL, rtol=0)
            order += ev.positions
        holes = [n0 + i for i, t in enumerate(text) if t == M]
        assert sorted(order) == holes and M not in state.tokens
        assert all(state.tokens[n0 + i] == t for i, t in enumerate(text) if t != M), "context unchanged"
        commit_pending(model, cache, state)
        assert_close_cache(cache, prefill_reference(model, cache))
        return cache, state, holes

    cached, s1, holes = run(True)
    uncached, s2, _ = run(False)
    assert s1.tokens == s2.tokens
    assert_close_cache(cached, uncached)
    # a normal turn after the infill continues from the filled sequence, as on a fresh session
    after = begin_turn(model, cached, s1, [5, 6], params)
    assert not after.infill and after.start == len(s2.tokens) + 2
    fresh_cache, fresh_state = prefill_reference(model, cached), copy.deepcopy(after)
    list(decode(model, cached, after, params))
    list(decode(model, fresh_cache, fresh_state, params))
    assert after.tokens == fresh_state.tokens


def test_begin_infill_is_begin_infill_turn_on_a_fresh_session(model: SetDLM) -> None:
    text = _infill_input(model)
    c1, c2 = fresh(model), fresh(model)
    s1, s2 = begin_infill(model, c1, text), begin_infill_turn(model, c2, None, text)
    assert s1 == s2 and s1.start == text.index(model.cfg.mask_id) and s1.nfe == 1
    assert_close_cache(c1, c2)
    with pytest.raises(DecodeError) as e:
        begin_infill(model, c1, text)  # the cache is not empty
    assert e.value.code == "state"
    sampled = DecodeParams(temperature=1.0, seed=3)
    assert begin_infill(model, fresh(model), text, sampled).rng is not None, "sampling seeds the RNG"


def test_a_refused_infill_turn_changes_nothing(model: SetDLM) -> None:
    M, L = model.cfg.mask_id, model.cfg.max_seq_len
    params = DecodeParams(window=4, tau=0.2, max_new_tokens=8)
    cache = fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    list(decode(model, cache, state, params))
    before = (cache.fork(), state.to_json())
    for bad, code in (([30, 31], "params"),  # no hole
                      ([30, M, model.cfg.vocab_size], "params"),  # outside the vocabulary
                      ([30, M, -1], "params"),
                      ([M] * (L - len(state.tokens) + 1), "context_overflow")):
        with pytest.raises(DecodeError) as e:
            begin_infill_turn(model, cache, state, bad, params)
        assert e.value.code == code, bad
        assert_same_cache(before[0], cache)
        assert state.to_json() == before[1], "a refused turn changes nothing"
    open_region = begin_turn(model, fresh(model), None, PROMPT, params)
    with pytest.raises(DecodeError) as e:
        begin_infill_turn(model, cache, open_region, [M], params)
    assert e.value.code == "state"
    # exactly up to the context is allowed
    state = begin_infill_turn(model, cache, state, [M] * (L - len(state.tokens)), params)
    assert len(state.tokens) == L
