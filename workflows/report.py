"""Report templates filled by infill: the template's text (and its payload) is the context, its
holes are masks decoded in place; positions never shift."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from model.corpus import mixture
from model.corpus.report import Template
from model.decode import DecodeParams, begin_infill, decode
from model.kv_cache import KVCache
from model.tokenizer import Tokenizer
from model.transformer import SetDLM


@dataclass
class FillResult:
    tokens: list[int]  # the filled sequence
    reference: list[int]  # the template filled with its own answers
    hole: list[bool]  # which positions were holes
    nfe: int  # forward passes, the context's prefill included
    seconds: float

    @property
    def exact(self) -> bool:
        return self.tokens == self.reference


@torch.no_grad()
def fill(model: SetDLM, tok: Tokenizer, template: Template, params: DecodeParams) -> FillResult:
    t0 = time.perf_counter()
    ids, hole = mixture.infill_tokens(tok, template)
    w = next(model.parameters())
    cache = KVCache.for_model(model.cfg, dtype=w.dtype, device=w.device)
    state = begin_infill(model, cache, [model.cfg.mask_id if h else x for x, h in zip(ids, hole)])
    for _ev in decode(model, cache, state, params):
        pass
    return FillResult(state.tokens, ids, hole, state.nfe, time.perf_counter() - t0)
