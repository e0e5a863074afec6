"""workflows/turn.py over a session in this process (the shipped model): a turn continues its
session, an input the model cannot take is refused, an infill text's holes are filled exactly."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from domain import report
from model.tokenizer import Tokenizer
from model.transformer import SetDLM
from runtime.errors import BadInput
from runtime.jobs.params import ParamsSpec
from runtime.jobs.specs import HOLE, InfillSpec, TurnSpec
from runtime.sessions.local import LocalTurns
from workflows import turn

PARAMS = ParamsSpec(policy="prefix", window=8, tau=0.99, max_new_tokens=24)


def test_turns_continue_their_session(session: Callable[[], LocalTurns], loaded: tuple[SetDLM, Tokenizer]) -> None:
    _, tok = loaded
    turns = session()
    first = turn.run(turns, TurnSpec(text="[BOS]company: Globex\nperiod: 2026-Q3\n", params=PARAMS))
    second = turn.run(turns, TurnSpec(text="\nnarrative: ", params=PARAMS))
    assert (first["path"], first["turn"], second["path"], second["turn"]) == ("new", 0, "warm", 1)
    for r in (first, second):
        assert 0 < len(r["tokens"]) <= PARAMS.max_new_tokens and r["text"] == tok.decode(r["tokens"], skip_special=True)
        assert r["costs"]["decode_s"] > 0 and r["nfe"] > 0
    # the same inputs as token ids, on a new session: the same tokens
    again = session()
    ids = [tok.encode("[BOS]company: Globex\nperiod: 2026-Q3\n"), tok.encode("\nnarrative: ")]
    assert [turn.run(again, TurnSpec(input_ids=x, params=PARAMS))["tokens"] for x in ids] == \
        [first["tokens"], second["tokens"]]


def test_an_input_the_model_cannot_take_is_refused(session: Callable[[], LocalTurns],
                                                   loaded: tuple[SetDLM, Tokenizer]) -> None:
    model, _ = loaded
    turns = session()
    for bad in ([model.cfg.mask_id], [model.cfg.vocab_size]):
        with pytest.raises(BadInput):
            turn.run(turns, TurnSpec(input_ids=bad, params=PARAMS))
    assert turns.used() == 0  # nothing was appended


@pytest.mark.parametrize("seed", ["a", "b", "c"])
def test_an_infill_fills_a_report_template_exactly(session: Callable[[], LocalTurns],
                                                  loaded: tuple[SetDLM, Tokenizer], seed: str) -> None:
    _, tok = loaded
    t = report.make_template(random.Random(seed))
    # a hole per token of each answer, as the model was trained to fill them
    text = "[BOS]" + t.context_text() + "".join(HOLE * len(tok.encode(x)) if h else x for x, h in t.pieces) + "[EOS]"
    r = turn.infill(session(), InfillSpec(text=text))
    assert r["text"] == t.context_text() + t.text(), r["text"]
    assert r["tokens"] == len(r["hole_tokens"]) == text.count(HOLE) and r["path"] == "new"
    assert r["holes"] == tok.decode([x for a in t.answers for x in tok.encode(a)], skip_special=True)
