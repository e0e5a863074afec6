"""What the decoding tests compare against: a fresh cache for the `test` model, the reference
cache of one causal prefill of a cache's commits (invariant I5), and two caches' K/V equal to
ATOL (fp32 on the CPU)."""

import torch

from model.decode import prefill
from model.kv_cache import KVCache
from model.transformer import SetDLM

ATOL = 1e-5


def fresh(model: SetDLM) -> KVCache:
    return KVCache.for_model(model.cfg)


@torch.no_grad()
def prefill_reference(model: SetDLM, cache: KVCache) -> KVCache:
    """I5's reference: one causal prefill of the committed tokens in commit order."""
    ref = fresh(model)
    prefill(model, ref, cache.tokens, cache.positions)
    return ref


def assert_close_cache(a: KVCache, b: KVCache) -> None:
    assert a.length == b.length and a.positions == b.positions and a.tokens == b.tokens
    n = a.length
    torch.testing.assert_close(a.k[:, :n], b.k[:, :n], atol=ATOL, rtol=0)
    torch.testing.assert_close(a.v[:, :n], b.v[:, :n], atol=ATOL, rtol=0)
