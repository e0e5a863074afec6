"""Decoding invariants I4-I6, I8-I10, I12-I15 of the reference note (section 6.2), on the
random `test` model in fp32."""

import copy

import pytest
import torch

from model.config import ModelConfig
from model.decode import (
    begin_infill,
    begin_infill_turn,
    begin_turn,
    commit_pending,
    decode,
    generate,
    prefill,
    step,
    truncate,
)
from model.kv_cache import KVCache
from model.masks import step_mask
from model.params import DecodeError, DecodeParams, DecodeState
from model.policy import active_positions, choose
from model.transformer import SetDLM
from tests.fakes import PROMPT, assert_same_cache, random_params, round_trip, uncached_logits

ATOL = 1e-5


def _fresh(model: SetDLM) -> KVCache:
    return KVCache.for_model(model.cfg)


@torch.no_grad()
def _prefill_reference(model: SetDLM, cache: KVCache) -> KVCache:
    """I5's reference: one causal prefill of the committed tokens in commit order."""
    ref = _fresh(model)
    prefill(model, ref, cache.tokens, cache.positions)
    return ref


def _assert_same_cache(a: KVCache, b: KVCache) -> None:
    assert a.length == b.length and a.positions == b.positions and a.tokens == b.tokens
    n = a.length
    torch.testing.assert_close(a.k[:, :n], b.k[:, :n], atol=ATOL, rtol=0)
    torch.testing.assert_close(a.v[:, :n], b.v[:, :n], atol=ATOL, rtol=0)


I4_PARAMS = [DecodeParams(policy="set", window=4, tau=0.3), DecodeParams(policy="set", window=6, tau=0.15),
             DecodeParams(policy="set", window=8, tau=0.0), DecodeParams(policy="set", window=3, tau=None),
             DecodeParams(policy="block", window=4, tau=0.3), DecodeParams(policy="prefix", window=6, tau=0.15),
             DecodeParams(policy="ar")]
for _p in I4_PARAMS:
    _p.max_new_tokens = 24


@pytest.mark.parametrize("params", I4_PARAMS + [random_params(torch.Generator().manual_seed(s)) for s in range(4)])
def test_I4_cached_logits_equal_uncached_at_every_step(model: SetDLM, params: DecodeParams) -> None:
    cache = _fresh(model)
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
    _assert_same_cache(cache, c2)


@pytest.mark.parametrize("seed", range(6))
def test_I5_cache_equals_one_causal_prefill_of_the_commits(model: SetDLM, seed: int) -> None:
    params = random_params(torch.Generator().manual_seed(100 + seed), max_new_tokens=30)
    toks, cache, state = generate(model, PROMPT, params)
    _assert_same_cache(cache, _prefill_reference(model, cache))
    n_decoded = len(state.tokens) - len(PROMPT)
    assert cache.length == len(PROMPT) + n_decoded - len(state.pending)
    assert model.cfg.mask_id not in cache.tokens, "a [MASK] never enters the cache"
    assert all(state.tokens[p] == t for p, t in zip(cache.positions, cache.tokens)), "ledger matches the sequence"
    assert sorted(cache.positions + state.pending) == list(range(len(state.tokens))), "every position committed once"


def test_I6_fused_commit_equals_eager_commit(model: SetDLM) -> None:
    params = DecodeParams(policy="set", window=5, tau=0.2, max_new_tokens=20)
    cache = _fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    for _ in range(3):
        step(model, cache, state, params)
    assert state.pending, "this test needs a non-empty pending set"
    c_eager, s_eager = cache.fork(), copy.deepcopy(state)
    fused = step(model, cache, state, params)  # commits pending + scores masks in one forward
    commit_pending(model, c_eager, s_eager)  # commits pending alone
    eager = step(model, c_eager, s_eager, params)  # then scores the masks
    torch.testing.assert_close(eager.logits, fused.logits, atol=ATOL, rtol=0)
    _assert_same_cache(cache, c_eager)
    assert s_eager.tokens == state.tokens and s_eager.nfe == state.nfe + 1


def test_I8_window_one_is_greedy_autoregression(model: SetDLM) -> None:
    N = 20
    for params in (DecodeParams(policy="ar", max_new_tokens=N),
                   DecodeParams(policy="set", window=1, tau=None, max_new_tokens=N),
                   DecodeParams(policy="set", window=1, tau=0.0, max_new_tokens=N)):
        cache = _fresh(model)
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


@pytest.mark.parametrize("seed", range(10))
def test_I9_window_and_threshold_semantics(model: SetDLM, seed: int) -> None:
    params = random_params(torch.Generator().manual_seed(200 + seed), max_new_tokens=32)
    cache = _fresh(model)
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
    cache = _fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    for e in decode(model, cache, state, params):
        block = (e.positions[0] - len(PROMPT)) // 4
        decoded_before = [p for p in range(len(PROMPT), len(PROMPT) + 4 * block)]
        assert all(state.tokens[p] != model.cfg.mask_id for p in decoded_before)


@pytest.mark.parametrize("tau", [None, 0.15, 0.0])
def test_I9_prefix_policy_decodes_an_unbroken_run_from_the_leftmost_mask(model: SetDLM, tau: float | None) -> None:
    params = DecodeParams(policy="prefix", window=6, tau=tau, max_new_tokens=30)
    cache = _fresh(model)
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


def test_I10_greedy_and_seeded_sampling_are_reproducible(model: SetDLM) -> None:
    greedy = DecodeParams(window=4, tau=0.3, max_new_tokens=24)
    assert generate(model, PROMPT, greedy)[0] == generate(model, PROMPT, greedy)[0]
    sampled = DecodeParams(window=4, tau=0.3, max_new_tokens=24, temperature=1.0, seed=7)
    a, b = generate(model, PROMPT, sampled)[0], generate(model, PROMPT, sampled)[0]
    other = generate(model, PROMPT, DecodeParams(window=4, tau=0.3, max_new_tokens=24, temperature=1.0, seed=8))[0]
    assert a == b and a != other


def test_I12_multi_turn_append_equals_a_fresh_session(model: SetDLM) -> None:
    params = DecodeParams(window=4, tau=0.25, max_new_tokens=16)
    cache = _fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    list(decode(model, cache, state, params))
    assert state.pending
    state = begin_turn(model, cache, state, [5, 6, 7], params)  # pending fused into this prefill
    assert not state.pending
    _assert_same_cache(cache, _prefill_reference(model, cache))
    fresh_cache, fresh_state = _prefill_reference(model, cache), copy.deepcopy(state)
    list(decode(model, cache, state, params))
    list(decode(model, fresh_cache, fresh_state, params))
    assert state.tokens == fresh_state.tokens
    _assert_same_cache(cache, fresh_cache)


def test_I13_rollback_then_recommit_equals_never_committed(model: SetDLM) -> None:
    params = DecodeParams(window=6, tau=0.15, max_new_tokens=30)
    _, cache, state = generate(model, PROMPT, params)
    commit_pending(model, cache, state)
    order = cache.positions

    def out_of_order(cut: int) -> bool:  # a slot past the cut was committed before a valid slot
        first_bad = next(i for i, p in enumerate(order) if p >= cut)
        return any(p < cut for p in order[first_bad:])

    cut = next(c for c in range(len(PROMPT) + 1, len(order)) if out_of_order(c))
    truncate(model, cache, state, cut)
    assert len(state.tokens) == cut and max(cache.positions) < cut
    assert cache.positions == [p for p in order if p < cut], "valid slots keep their commit order"
    _assert_same_cache(cache, _prefill_reference(model, cache))


def test_stop_sequence_ends_at_a_fully_decoded_prefix(model: SetDLM) -> None:
    params = DecodeParams(window=6, tau=0.15, max_new_tokens=40)
    full, _, _ = generate(model, PROMPT, params)
    stop_tok = full[8]
    first = full.index(stop_tok)
    stopped = DecodeParams(window=6, tau=0.15, max_new_tokens=40, stop=[[stop_tok]])
    toks, cache, state = generate(model, PROMPT, stopped)
    assert toks == full[: first + 1], "same tokens up to and including the stop, nothing after"
    assert model.cfg.mask_id not in state.tokens, "no mask is left, none was compacted"
    assert max(cache.positions + state.pending) == len(state.tokens) - 1
    _assert_same_cache(cache, _prefill_reference(model, cache))
    with pytest.raises(DecodeError):
        DecodeParams(stop=[[]])


def _with_eos(model: SetDLM, eos: int) -> SetDLM:
    """The same weights under a config whose EOS is `eos`."""
    eos_model = SetDLM(ModelConfig.from_name("test", eos_id=eos))
    eos_model.load_state_dict(model.state_dict())
    return eos_model.eval()


def test_eos_stops_generation(model: SetDLM) -> None:
    full, _, _ = generate(model, PROMPT, DecodeParams(policy="ar", max_new_tokens=30))
    eos_model = _with_eos(model, full[3])  # the 4th generated token plays EOS
    toks, _, state = generate(eos_model, PROMPT, DecodeParams(policy="ar", max_new_tokens=30))
    assert toks == full[: full.index(full[3]) + 1] and state.done


@pytest.mark.parametrize("W,tau", [(1, None), (4, 0.2), (8, 0.0)])
def test_I14_infill_fills_holes_and_keeps_context(model: SetDLM, W: int, tau: float | None) -> None:
    M = model.cfg.mask_id
    text = [2, 20, 21, M, M, M, 22, 23, M, M, 24, 25, M, 26]
    params = DecodeParams(policy="set", window=W, tau=tau, max_new_tokens=0)
    cache = _fresh(model)
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
    _assert_same_cache(cache, _prefill_reference(model, cache))


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
        cache = _fresh(model)
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
        _assert_same_cache(cache, _prefill_reference(model, cache))
        return cache, state, holes

    cached, s1, holes = run(True)
    uncached, s2, _ = run(False)
    assert s1.tokens == s2.tokens
    _assert_same_cache(cached, uncached)
    # a normal turn after the infill continues from the filled sequence, as on a fresh session
    after = begin_turn(model, cached, s1, [5, 6], params)
    assert not after.infill and after.start == len(s2.tokens) + 2
    fresh_cache, fresh_state = _prefill_reference(model, cached), copy.deepcopy(after)
    list(decode(model, cached, after, params))
    list(decode(model, fresh_cache, fresh_state, params))
    assert after.tokens == fresh_state.tokens


def test_begin_infill_is_begin_infill_turn_on_a_fresh_session(model: SetDLM) -> None:
    text = _infill_input(model)
    c1, c2 = _fresh(model), _fresh(model)
    s1, s2 = begin_infill(model, c1, text), begin_infill_turn(model, c2, None, text)
    assert s1 == s2 and s1.start == text.index(model.cfg.mask_id) and s1.nfe == 1
    _assert_same_cache(c1, c2)
    with pytest.raises(DecodeError) as e:
        begin_infill(model, c1, text)  # the cache is not empty
    assert e.value.code == "state"
    sampled = DecodeParams(temperature=1.0, seed=3)
    assert begin_infill(model, _fresh(model), text, sampled).rng is not None, "sampling seeds the RNG"


def test_a_refused_infill_turn_changes_nothing(model: SetDLM) -> None:
    M, L = model.cfg.mask_id, model.cfg.max_seq_len
    params = DecodeParams(window=4, tau=0.2, max_new_tokens=8)
    cache = _fresh(model)
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
    open_region = begin_turn(model, _fresh(model), None, PROMPT, params)
    with pytest.raises(DecodeError) as e:
        begin_infill_turn(model, cache, open_region, [M], params)
    assert e.value.code == "state"
    # exactly up to the context is allowed
    state = begin_infill_turn(model, cache, state, [M] * (L - len(state.tokens)), params)
    assert len(state.tokens) == L


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
    cache = _fresh(model)
    with pytest.raises(DecodeError):
        begin_turn(model, cache, None, [model.cfg.mask_id], DecodeParams())
    with pytest.raises(DecodeError):
        begin_turn(model, cache, None, [10_000], DecodeParams())
    assert cache.length == 0


def test_ignore_eos_decodes_exactly_max_new_tokens(model: SetDLM) -> None:
    full, _, _ = generate(model, PROMPT, DecodeParams(policy="ar", max_new_tokens=30))
    eos_model = _with_eos(model, full[3])
    toks, _, state = generate(eos_model, PROMPT, DecodeParams(policy="ar", max_new_tokens=30, ignore_eos=True))
    assert toks == full and state.done


def test_stop_event_reports_the_cut(model: SetDLM) -> None:
    full, _, _ = generate(model, PROMPT, DecodeParams(window=6, tau=0.15, max_new_tokens=40))
    params = DecodeParams(window=6, tau=0.15, max_new_tokens=40, stop=[[full[8]]])
    cache = _fresh(model)
    state = begin_turn(model, cache, None, PROMPT, params)
    events = list(decode(model, cache, state, params))
    assert events[-1].cut == len(state.tokens) and all(e.cut is None for e in events[:-1])
    assert all(p < events[-1].cut for p in events[-1].positions)
    shown: dict[int, int] = {}  # what a streaming client would display, erasing past the cut
    for e in events:
        shown.update(zip(e.positions, e.tokens))
        if e.cut is not None:
            shown = {p: t for p, t in shown.items() if p < e.cut}
    assert [shown[p] for p in sorted(shown)] == state.tokens[len(PROMPT):]


def test_sampling_rng_carries_across_turns(model: SetDLM) -> None:
    """Turn 2 continues the session's random stream (not a reseed), so a session resumed from
    its serialised state samples exactly what an uninterrupted one does."""
    params = DecodeParams(window=3, tau=0.3, max_new_tokens=12, temperature=1.0, seed=3)

    def two_turns(roundtrip: bool) -> list[int]:
        cache = _fresh(model)
        state = begin_turn(model, cache, None, PROMPT, params)
        list(decode(model, cache, state, params))
        rng_after_turn1 = state.rng
        if roundtrip:
            cache, state = round_trip(cache), DecodeState.from_json(state.to_json())
        state = begin_turn(model, cache, state, [5, 6], params)
        assert state.rng == rng_after_turn1, "no reseed on turn 2"
        list(decode(model, cache, state, params))
        return state.tokens

    assert two_turns(False) == two_turns(True)
