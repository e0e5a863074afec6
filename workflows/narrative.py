"""One dashboard narrative from a metrics payload: a single short generation (high volume)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from model.config import BOS_ID
from model.corpus import narrative as corpus
from model.decode import DecodeParams, generate
from model.tokenizer import Tokenizer
from model.transformer import SetDLM


@dataclass
class NarrativeResult:
    text: str
    generated: int  # tokens written (EOS included)
    nfe: int  # forward passes, the prompt's prefill included
    seconds: float


def prompt_ids(tok: Tokenizer, payload: corpus.Payload) -> list[int]:
    return [BOS_ID, *tok.encode(corpus.prompt_text(payload))]


def narrate(model: SetDLM, tok: Tokenizer, payload: corpus.Payload, params: DecodeParams) -> NarrativeResult:
    t0 = time.perf_counter()
    out, _, state = generate(model, prompt_ids(tok, payload), params)
    new = [t for t in out if t != model.cfg.mask_id]
    return NarrativeResult(tok.decode(new, skip_special=True), len(new), state.nfe, time.perf_counter() - t0)
