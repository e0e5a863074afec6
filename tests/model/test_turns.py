"""Opening a region (begin_turn), invariants I12 and I15 of the reference note (section 6.2): a
turn appended to a session equals a fresh session, and a turn refused (past the context, bad
parameters or ids) changes nothing."""

import copy

import pytest

from model.decode import begin_turn, decode, generate
from model.params import DecodeError, DecodeParams
from model.transformer import SetDLM
from tests.fakes import PROMPT, assert_same_cache
from tests.model.reference import assert_close_cache, fresh, prefill_reference


def test_I12_multi_turn_append_equals_a_fresh_session(model: SetDLM) -> None:
    params = DecodeParams(window=4, tau=0.25, max_new_tokens=16)
    cache = fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    list(decode(model, cache, state, params))
    assert state.pending
    state = begin_turn(model, cache, state, [5, 6, 7], params)  # pending fused into this prefill
    assert not state.pending
    assert_close_cache(cache, prefill_reference(model, cache))
    fresh_cache, fresh_state = prefill_reference(model, cache), copy.deepcopy(state)
    list(decode(model, cache, state, params))
    list(decode(model, fresh_cache, fresh_state, params))
    assert state.tokens == fresh_state.tokens
    assert_close_cache(cache, fresh_cache)


def test_I15_context_overflow_is_refused_without_changing_state(model: SetDLM) -> None:
    L = model.cfg.max_seq_len
    params = DecodeParams(window=8, tau=0.0, max_new_tokens=L - len(PROMPT))
    _, cache, state = generate(model, PROMPT, params)  # exactly fills the context
    assert len(state.tokens) == L and cache.length + len(state.pending) == L
    before = (cache.fork(), state.to_json())
    with pytest.raises(DecodeError) as e:
        begin_turn(model, cache, state, [5], DecodeParams(max_new_tokens=0))
    assert e.value.code == "context_overflow"
    assert_same_cache(before[0], cache)
    assert state.to_json() == before[1], "a refused turn changes nothing"
    assert cache.length <= L and len(set(cache.positions)) == cache.length
    assert all(state.tokens[p] == t for p, t in zip(cache.positions, cache.tokens))


def test_bad_parameters_are_named_errors(model: SetDLM) -> None:
    for kw in ({"policy": "beam"}, {"window": 0}, {"max_new_tokens": -1}, {"temperature": -1.0}):
        with pytest.raises(DecodeError) as e:
            DecodeParams(**kw)  # type: ignore[arg-type]
        assert e.value.code == "params"
    cache = fresh(model)
    with pytest.raises(DecodeError):
        begin_turn(model, cache, None, [model.cfg.mask_id], DecodeParams())
    with pytest.raises(DecodeError):
        begin_turn(model, cache, None, [10_000], DecodeParams())
    assert cache.length == 0
