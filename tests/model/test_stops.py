"""Where a region ends: a stop sequence or EOS inside the fully decoded prefix (not with
ignore_eos), the cut its last event reports, and the rollback past it (truncate, invariant I13
of the reference note, section 6.2)."""

import pytest

from model.config import ModelConfig
from model.decode import begin_turn, commit_pending, decode, generate, truncate
from model.params import DecodeError, DecodeParams
from model.transformer import SetDLM
from tests.fakes import PROMPT
from tests.model.reference import assert_close_cache, fresh, prefill_reference


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
    assert_close_cache(cache, prefill_reference(model, cache))


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
    assert_close_cache(cache, prefill_reference(model, cache))
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


def test_ignore_eos_decodes_exactly_max_new_tokens(model: SetDLM) -> None:
    full, _, _ = generate(model, PROMPT, DecodeParams(policy="ar", max_new_tokens=30))
    eos_model = _with_eos(model, full[3])
    toks, _, state = generate(eos_model, PROMPT, DecodeParams(policy="ar", max_new_tokens=30, ignore_eos=True))
    assert toks == full and state.done


def test_stop_event_reports_the_cut(model: SetDLM) -> None:
    full, _, _ = generate(model, PROMPT, DecodeParams(window=6, tau=0.15, max_new_tokens=40))
    params = DecodeParams(window=6, tau=0.15, max_new_tokens=40, stop=[[full[8]]])
    cache = fresh(model)
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
