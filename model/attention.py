"""Attention as the model runs it, for every place that holds keys (model/kv_cache.py,
model/batch.py) and the model itself: an additive mask, then grouped-query scaled dot-product
attention: on a CPU with AVX2 (or AVX-512), model/attend.c (each query row in one order over
the keys it attends, whatever the call); elsewhere, and under autograd, torch's SDPA.  Knows nothing of
caches or models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from model import rowdot


def additive(mask: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A boolean mask (True = attend) as the additive one attention takes: 0 or -inf."""
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask.to(device), float("-inf"))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """q (B, T, H, D) over k, v (B, S, Hkv, D) (grouped-query), mask (B|1, T, S) additive ->
    (B, T, H * D)."""
    out = heads(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask[:, None])  # (B, H, T, D)
    return out.transpose(1, 2).reshape(*q.shape[:2], -1)


def heads(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """The same, heads first: q (B, H, T, D) over k, v (B, Hkv, S, D), mask (B|1, 1, T, S) ->
    (B, H, T, D).  Given views of the same layout, the same call gives the same bits whoever
    makes it (model/batch.py makes one per sequence of a batch, as a batch-1 forward does)."""
    if rowdot.attends(q, k, v, mask):
        return rowdot.attend(q, k, v, mask, torch.get_num_threads())
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
