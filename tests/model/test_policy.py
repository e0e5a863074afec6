"""The decoding policy (model/policy.py), invariant I9 of the reference note (section 6.2): the
window and the threshold, the block policy's fixed blocks, the prefix policy's unbroken run."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from model.decode import begin_turn, decode, step
from model.params import DecodeParams, DecodeState
from model.policy import active_positions, choose, next_set
from model.transformer import SetDLM
from tests.fakes import PROMPT, random_params
from tests.model.reference import fresh

MASK = 11  # the pure tests' mask id: the last of their 12 ids, never predicted (its logit -inf, as greedy's)


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


class _Odd:
    """A guide of pure logic: after an even token, an even one is refused; it counts its questions."""

    def __init__(self) -> None:
        self.asked = 0

    def allows(self, before: list[int], token: int) -> bool | None:
        self.asked += 1
        return None if not before else before[-1] % 2 == 1 or token % 2 == 1


def _every_position(guide: _Odd, state: DecodeState, active: list[int], logits: torch.Tensor,
                    params: DecodeParams) -> list[tuple[int, int]]:
    """The oracle: every active position held to the guide, left to right (a refused token's
    stand-in the most probable allowed one), then the chosen run from the leftmost; (position,
    token) committed."""
    probs = logits.softmax(-1)
    conf, tok = probs.max(-1)
    toks = state.tokens[state.start:]
    for j, pos in enumerate(active):
        before = toks[:pos - state.start]
        if guide.allows(before, int(tok[j])) is False:
            t = next(t for t in probs[j].argsort(descending=True).tolist() if guide.allows(before, t))
            tok[j], conf[j] = t, probs[j, t]
        toks[pos - state.start] = int(tok[j])
    order = choose(tok, conf, params)
    n = next((k for k, j in enumerate(order) if j != k), len(order))
    return [(active[j], int(tok[j])) for j in range(max(n, 1))]


@pytest.mark.parametrize("policy", ["set", "prefix", "block", "ar"])
def test_a_guide_is_asked_only_about_the_run_a_step_may_commit(policy: str) -> None:
    """Past the leftmost mask a position joins the committed run only over tau, so the guiding
    stops at the first under it (model/policy.py guided): what a step commits is what guiding
    every position commits, and a guide over a long text is asked about a few tokens a step."""
    g = torch.Generator().manual_seed(3)
    asked = {"cut": 0, "every": 0}
    for trial in range(300):
        W, V = 8, 12
        tau = [None, 0.0, 0.2, 0.5, 0.9][trial % 5]
        params = DecodeParams(policy=policy, window=W, tau=tau, max_new_tokens=W)
        state = DecodeState(tokens=[1, 2, 3] + [MASK] * W, start=3)
        active = list(range(3, 3 + W))
        logits = torch.randn(W, V, generator=g) * (1 + trial % 7)
        logits[:, MASK] = -torch.inf
        oracle = _Odd()
        want = _every_position(oracle, state, active, logits.clone(), params)
        guide = _Odd()
        probs = logits.softmax(-1)
        conf, tok = probs.max(-1)
        order = next_set(state, replace(params, guide=guide), active, logits, tok, conf, MASK)
        assert [(active[j], int(tok[j])) for j in order] == want, (trial, tau)
        asked["cut"] += guide.asked
        asked["every"] += oracle.asked
    assert asked["cut"] < asked["every"], asked


class _Grammar:
    """A MaskGuide for the pure tests: after `before`, a token t is allowed where (t + sum(before))
    % 3 != 0; every fourth position forces one token (the only one allowed)."""

    def allowed(self, before: list[int]) -> np.ndarray:
        V = 12
        ok = np.array([(t + sum(before)) % 3 != 0 and t != MASK for t in range(V)])
        if len(before) % 4 == 3:
            ok[:] = False
            ok[(len(before) * 5) % (V - 1)] = True
        return ok

    def allows(self, before: list[int], token: int) -> bool | None:
        return bool(self.allowed(before)[token])


@pytest.mark.parametrize("policy", ["set", "prefix", "block", "ar"])
def test_a_grammar_commits_a_run_its_mask_allows_token_by_token(policy: str) -> None:
    """Under a MaskGuide (a grammar) a step commits the run from the leftmost mask, each token one
    its mask allows after the tokens really before it (a refused one's stand-in the most probable
    allowed one; a forced one taken whatever its probability): a prefix of a text the grammar can
    complete, under every policy."""
    g = torch.Generator().manual_seed(5)
    grammar, forced = _Grammar(), 0
    for trial in range(200):
        W, V = 8, 12
        tau = [None, 0.0, 0.2, 0.5, 0.9][trial % 5]
        params = DecodeParams(policy=policy, window=W, tau=tau, max_new_tokens=W, guide=grammar)
        written = [4, 5, 7][:trial % 4]  # the region's tokens decoded before this step
        state = DecodeState(tokens=[1, 2, 3] + written + [MASK] * W, start=3)
        active = list(range(3 + len(written), 3 + len(written) + W))
        logits = torch.randn(W, V, generator=g) * (1 + trial % 7)
        logits[:, MASK] = -torch.inf
        probs = logits.softmax(-1)
        conf, tok = probs.max(-1)
        order = next_set(state, params, active, logits, tok, conf, MASK)
        assert order == list(range(len(order))) and order, "the run from the leftmost"
        before = list(written)
        for j in order:
            ok = grammar.allowed(before)
            t = int(tok[j])
            assert ok[t], (trial, j, before, t)
            if ok.sum() == 1:
                forced += 1
                assert float(conf[j]) == 1.0
            elif t != int(probs[j].argmax()):
                assert t == int(torch.where(torch.from_numpy(ok), probs[j], -1.0).argmax()), "the most probable allowed"
            before.append(t)
    assert forced, "no position was forced: the test tests nothing"
