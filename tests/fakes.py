"""Test models: the `test` preset with random weights, sharpened so that its predictions have
varied confidences (std 0.02 gives near-uniform logits, where tau would never matter).  Also: an
exact comparison of two caches, and a cache's round trip through the one K/V byte format."""

from __future__ import annotations

import torch

from model.config import ModelConfig
from model.kv_cache import KVCache
from model.masks import step_mask, within_documents
from model.params import DecodeParams, DecodeState
from model.transformer import SetDLM
from runtime.sessions import kv


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
    mask = within_documents(step_mask(0, C + m, n, dev), pos_t, ids_t, pos_t, model.cfg.doc_start_id)  # BOS starts a document
    logits, _ = model(ids_t, pos_t, mask)
    return logits[0, C + m:]


def assert_same_cache(a: KVCache, b: KVCache) -> None:
    """Exactly the same valid slots: length, ledger (positions, tokens) and K/V, bit for bit (dtype too)."""
    n = a.length
    assert b.length == n, f"{b.length} slots, expected {n}"
    assert b.positions == a.positions and b.tokens == a.tokens, "the ledgers differ"
    assert b.k.dtype == a.k.dtype and b.v.dtype == a.v.dtype, f"{b.k.dtype}, expected {a.k.dtype}"
    assert torch.equal(b.k[:, :n], a.k[:, :n]) and torch.equal(b.v[:, :n], a.v[:, :n]), "the K/V differ"


def round_trip(cache: KVCache, fingerprint: str = "fp", max_bytes: int = 1 << 20,
               device: torch.device | str = "cpu") -> KVCache:
    """The cache through its bytes (runtime/sessions/kv.py segments, the ledger beside them)."""
    blobs = kv.to_segments(cache, 0, cache.length, fingerprint, max_bytes)
    return kv.from_segments(blobs, fingerprint, cache.positions, cache.tokens, device)
