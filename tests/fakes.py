"""Test models: the `test` preset with random weights, sharpened so that its predictions have
varied confidences (std 0.02 gives near-uniform logits, where tau would never matter)."""

from __future__ import annotations

import torch

from model.config import ModelConfig
from model.params import DecodeParams, DecodeState
from model.kv_cache import KVCache
from model.masks import step_mask, within_documents
from model.transformer import SetDLM


def random_model(seed: int = 0, **overrides: object) -> SetDLM:
    torch.manual_seed(seed)
    model = SetDLM(ModelConfig.from_name("test", **overrides))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return model.eval()


def random_params(rng: torch.Generator, max_new_tokens: int = 24) -> DecodeParams:
    """A random policy, window and tau (sometimes off, sometimes 'decode everything')."""
    policy = ["set", "prefix", "block", "ar"][int(torch.randint(4, (1,), generator=rng))]
    W = int(torch.randint(1, 9, (1,), generator=rng))
    tau_choice = int(torch.randint(4, (1,), generator=rng))
    tau = [None, 0.0, float(torch.rand(1, generator=rng)) * 0.6, 0.3][tau_choice]
    return DecodeParams(policy=policy, window=W, tau=tau, max_new_tokens=max_new_tokens)


PROMPT = [2, 10, 11, 12, 13, 14]


@torch.no_grad()
def uncached_logits(model: SetDLM, cache: KVCache, state: DecodeState, active: list[int]) -> torch.Tensor:
    """I4's reference: one no-cache forward over [committed (commit order) | pending | masks],
    with the mask built by the training rule (step_mask with no cache).  (n_active, vocab)."""
    C, m, n = cache.length, len(state.pending), len(active)
    ids = cache.tokens + [state.tokens[p] for p in state.pending] + [model.cfg.mask_id] * n
    pos = cache.positions + state.pending + active
    dev = cache.k.device
    ids_t, pos_t = torch.tensor(ids, device=dev), torch.tensor(pos, device=dev)
    mask = within_documents(step_mask(0, C + m, n, dev), pos_t, ids_t, pos_t, model.cfg.bos_id)  # BOS starts a document
    logits, _ = model(ids_t, pos_t, mask)
    return logits[0, C + m:]
