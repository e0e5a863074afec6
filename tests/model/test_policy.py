"""The decoding policy (model/policy.py), invariant I9 of the reference note (section 6.2): the
window and the threshold, the block policy's fixed blocks, the prefix policy's unbroken run."""

import pytest
import torch

from model.decode import begin_turn, decode, step
from model.params import DecodeParams
from model.policy import active_positions, choose
from model.transformer import SetDLM
from tests.fakes import PROMPT, random_params
from tests.model.reference import fresh


@pytest.mark.parametrize("seed", range(10))
def test_I9_window_and_threshold_semantics(model: SetDLM, seed: int) -> None:
    params = random_params(torch.Generator().manual_seed(200 + seed), max_new_tokens=32)
    cache = fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    last_p0 = -1
    while not state.done:
        active = active_positions(state, params, model.cfg.mask_id)
        p0 = state.tokens.index(model.cfg.mask_id, state.start)
        assert p0 >= last_p0, "the leftmost mask never moves left"
        last_p0 = p0
        ev = step(model, cache, state, params)
        assert 1 <= len(ev.positions) <= params.window
        assert set(ev.positions) <= set(active), "nothing outside the window is decoded"
        assert all(p0 <= p < p0 + params.window for p in ev.positions)
        if params.tau is None:
            assert len(ev.positions) == 1
        elif params.tau <= 0 and params.policy != "prefix":  # prefix: see its own test
            assert ev.positions == active
        assert state.tokens[: len(PROMPT)] == PROMPT, "the prompt never changes"


def test_I9_block_policy_waits_for_the_block(model: SetDLM) -> None:
    params = DecodeParams(policy="block", window=4, tau=None, max_new_tokens=12)
    cache = fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    for e in decode(model, cache, state, params):
        block = (e.positions[0] - len(PROMPT)) // 4
        decoded_before = [p for p in range(len(PROMPT), len(PROMPT) + 4 * block)]
        assert all(state.tokens[p] != model.cfg.mask_id for p in decoded_before)


@pytest.mark.parametrize("tau", [None, 0.15, 0.0])
def test_I9_prefix_policy_decodes_an_unbroken_run_from_the_leftmost_mask(model: SetDLM, tau: float | None) -> None:
    params = DecodeParams(policy="prefix", window=6, tau=tau, max_new_tokens=30)
    cache = fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    sizes = []
    while not state.done:
        active = active_positions(state, params, model.cfg.mask_id)
        p0 = active[0]
        ev = step(model, cache, state, params)
        n = len(ev.positions)
        assert ev.positions == list(range(p0, p0 + n)), "the leftmost mask and the run right after it"
        logits = ev.logits.float().clone()
        logits[:, model.cfg.mask_id] = -torch.inf  # as decoding scores them: [MASK] is never a choice
        top, ids = logits.softmax(-1).max(-1)
        if tau is not None:  # a run of more than one: every chosen position clears tau and differs
            # from its left neighbour; the run ends at the window, an unsure mask, a repeat or a stop
            assert n == 1 or all(top[j] >= tau for j in range(n))
            assert all(ids[j] != ids[j - 1] for j in range(1, n))
            assert (n == len(active) or top[0] < tau or top[n] < tau or ids[n] == ids[n - 1]
                    or ev.cut is not None)
        else:
            assert n == 1
        generated = state.tokens[len(PROMPT):ev.cut or len(state.tokens)]
        decoded = [t != model.cfg.mask_id for t in generated]
        assert decoded == sorted(decoded, reverse=True), "no mask left of a decoded token"
        sizes.append(n)
    if tau == 0.0:
        assert max(sizes) > 1


def test_prefix_and_set_choose_differently() -> None:
    conf = torch.tensor([0.2, 0.95, 0.97, 0.1])
    tok = torch.tensor([5, 6, 7, 8])
    assert choose(tok, conf, DecodeParams(policy="set", window=4, tau=0.9)) == [1, 2]
    assert choose(tok, conf, DecodeParams(policy="prefix", window=4, tau=0.9)) == [0]
    sure = torch.tensor([0.91, 0.95, 0.5, 0.99])
    assert choose(tok, sure, DecodeParams(policy="prefix", window=4, tau=0.9)) == [0, 1]
    # a token repeating its left neighbour ends the run ("USD" + "D"): decided next step
    assert choose(torch.tensor([5, 5, 7, 8]), torch.ones(4), DecodeParams(policy="prefix", tau=0.9)) == [0]
    assert choose(torch.tensor([5, 6, 6, 8]), torch.ones(4), DecodeParams(policy="prefix", tau=0.9)) == [0, 1]
