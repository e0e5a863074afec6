"""The engine tests' turns (test_engine*.py): decoding parameters, a narrative payload and a
follow-up, as token ids."""

from __future__ import annotations

from domain.payload import Metric, Payload
from model.params import DecodeParams
from model.tokenizer import Tokenizer
from workflows.narrative import prompt_ids

PARAMS = DecodeParams(policy="set", window=4, tau=0.9, max_new_tokens=48)
PAYLOAD = Payload("Globex", "2026-Q3", "brief", [Metric("revenue", "1240", "1105", "1300")])
FOLLOW_UP = "\nnarrative: "


def inputs(tok: Tokenizer) -> tuple[list[int], list[int]]:
    """The first turn's ids (the payload's prompt) and the second's (the follow-up)."""
    return prompt_ids(tok, PAYLOAD), tok.encode(FOLLOW_UP)
