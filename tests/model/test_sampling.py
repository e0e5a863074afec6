"""Sampling, invariant I10 of the reference note (section 6.2): greedy and seeded sampling are
reproducible, and the session's RNG carries across turns (through its serialised state too)."""

from model.decode import begin_turn, decode, generate
from model.params import DecodeParams, DecodeState
from model.transformer import SetDLM
from tests.fakes import PROMPT, round_trip
from tests.model.reference import fresh


def test_I10_greedy_and_seeded_sampling_are_reproducible(model: SetDLM) -> None:
    greedy = DecodeParams(window=4, tau=0.3, max_new_tokens=24)
    assert generate(model, PROMPT, greedy)[0] == generate(model, PROMPT, greedy)[0]
    sampled = DecodeParams(window=4, tau=0.3, max_new_tokens=24, temperature=1.0, seed=7)
    a, b = generate(model, PROMPT, sampled)[0], generate(model, PROMPT, sampled)[0]
    other = generate(model, PROMPT, DecodeParams(window=4, tau=0.3, max_new_tokens=24, temperature=1.0, seed=8))[0]
    assert a == b and a != other


def test_sampling_rng_carries_across_turns(model: SetDLM) -> None:
    """Turn 2 continues the session's random stream (not a reseed), so a session resumed from
    its serialised state samples exactly what an uninterrupted one does."""
    params = DecodeParams(window=3, tau=0.3, max_new_tokens=12, temperature=1.0, seed=3)

    def two_turns(roundtrip: bool) -> list[int]:
        cache = fresh(model)
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
