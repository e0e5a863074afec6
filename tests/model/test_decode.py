"""Decoding invariants I4-I6 and I8 of the reference note (section 6.2): the cached step's logits
equal the uncached forward's, the cache is one causal prefill of its commits, a fused commit
equals an eager one, and W = 1 is greedy autoregression; on the random `test` model in fp32."""

import copy

import pytest
import torch

from model.decode import begin_turn, commit_pending, decode, generate, step
from model.masks import step_mask
from model.params import DecodeParams
from model.policy import active_positions
from model.transformer import SetDLM
from tests.fakes import PROMPT, random_params, uncached_logits
from tests.model.reference import ATOL, assert_close_cache, fresh, prefill_reference

I4_PARAMS = [DecodeParams(policy="set", window=4, tau=0.3), DecodeParams(policy="set", window=6, tau=0.15),
             DecodeParams(policy="set", window=8, tau=0.0), DecodeParams(policy="set", window=3, tau=None),
             DecodeParams(policy="block", window=4, tau=0.3), DecodeParams(policy="prefix", window=6, tau=0.15),
             DecodeParams(policy="ar")]
for _p in I4_PARAMS:
    _p.max_new_tokens = 24


@pytest.mark.parametrize("params", I4_PARAMS + [random_params(torch.Generator().manual_seed(s)) for s in range(4)])
def test_I4_cached_logits_equal_uncached_at_every_step(model: SetDLM, params: DecodeParams) -> None:
    cache = fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    steps = sizes = 0
    while not state.done:
        active = active_positions(state, params, model.cfg.mask_id)
        ref = uncached_logits(model, cache, state, active)
        ev = step(model, cache, state, params)
        torch.testing.assert_close(ev.logits, ref, atol=ATOL, rtol=0)
        steps += 1
        sizes = max(sizes, len(ev.positions))
    assert steps >= 3
    if params in I4_PARAMS and params.policy != "ar" and params.tau is not None:
        assert sizes > 1, "some step decoded a multi-token set"
    # and the whole uncached decoding path gives the same tokens and the same cache
    base = copy.deepcopy(params)
    base.use_cache = False
    toks, c2, _ = generate(model, PROMPT, base)
    assert toks == state.tokens[len(PROMPT):]
    assert_close_cache(cache, c2)


@pytest.mark.parametrize("seed", range(6))
def test_I5_cache_equals_one_causal_prefill_of_the_commits(model: SetDLM, seed: int) -> None:
    params = random_params(torch.Generator().manual_seed(100 + seed), max_new_tokens=30)
    toks, cache, state = generate(model, PROMPT, params)
    assert_close_cache(cache, prefill_reference(model, cache))
    n_decoded = len(state.tokens) - len(PROMPT)
    assert cache.length == len(PROMPT) + n_decoded - len(state.pending)
    assert model.cfg.mask_id not in cache.tokens, "a [MASK] never enters the cache"
    assert all(state.tokens[p] == t for p, t in zip(cache.positions, cache.tokens)), "ledger matches the sequence"
    assert sorted(cache.positions + state.pending) == list(range(len(state.tokens))), "every position committed once"


def test_I6_fused_commit_equals_eager_commit(model: SetDLM) -> None:
    params = DecodeParams(policy="set", window=5, tau=0.2, max_new_tokens=20)
    cache = fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    for _ in range(3):
        step(model, cache, state, params)
    assert state.pending, "this test needs a non-empty pending set"
    c_eager, s_eager = cache.fork(), copy.deepcopy(state)
    fused = step(model, cache, state, params)  # commits pending + scores masks in one forward
    commit_pending(model, c_eager, s_eager)  # commits pending alone
    eager = step(model, c_eager, s_eager, params)  # then scores the masks
    torch.testing.assert_close(eager.logits, fused.logits, atol=ATOL, rtol=0)
    assert_close_cache(cache, c_eager)
    assert s_eager.tokens == state.tokens and s_eager.nfe == state.nfe + 1


def test_I8_window_one_is_greedy_autoregression(model: SetDLM) -> None:
    N = 20
    for params in (DecodeParams(policy="ar", max_new_tokens=N),
                   DecodeParams(policy="set", window=1, tau=None, max_new_tokens=N),
                   DecodeParams(policy="set", window=1, tau=0.0, max_new_tokens=N)):
        cache = fresh(model)
        state = begin_turn(model, cache, None, PROMPT, params)
        events = list(decode(model, cache, state, params))
        assert [e.positions for e in events] == [[len(PROMPT) + i] for i in range(len(events))]
        seq = list(PROMPT)
        with torch.no_grad():
            while len(seq) < len(state.tokens):  # iterated argmax of the uncached forward
                ids, pos = seq + [model.cfg.mask_id], list(range(len(seq) + 1))
                logits, _ = model(torch.tensor(ids), torch.tensor(pos), step_mask(0, len(seq), 1))
                logits[0, -1, model.cfg.mask_id] = -torch.inf
                seq.append(int(logits[0, -1].argmax()))
        assert state.tokens == seq
        assert state.nfe == 1 + len(events) and len(events) == len(seq) - len(PROMPT)
