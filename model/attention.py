"""Attention as the model runs it, for every place that holds keys (model/kv_cache.py,
model/batch.py) and the model itself: an additive mask, then grouped-query scaled dot-product
attention.  Knows nothing of caches or models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def additive(mask: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A boolean mask (True = attend) as the additive one attention takes: 0 or -inf."""
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask.to(device), float("-inf"))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """q (B, T, H, D) over k, v (B, S, Hkv, D) (grouped-query), mask (B|1, T, S) additive ->
    (B, T, H * D)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask[:, None], enable_gqa=True)  # (B, H, T, D)
    return out.transpose(1, 2).reshape(*q.shape[:2], -1)
