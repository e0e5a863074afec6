"""Set-causal attention masks (boolean, True = may attend).

Two masks, one rule: a query sees exactly the clean tokens ranked before it in the generation
order (clean queries also see themselves), and a [MASK] query sees nothing noisy but itself.
- `training_mask`: the static 2L x 2L mask over [clean stream | noisy stream] in RANK order
  (the data are permuted, not the mask), plus the padding rule.
- `step_mask`: the inference mask over [cache | pending set | active masks].
- `within_documents`: narrows an inference mask to documents: a BOS token starts a new one, and
  no query sees a key of an earlier document.  The model is trained on single documents (each
  example starts with BOS at position 0), where this rule changes nothing; in a session that
  holds several (report sections, a new question), it keeps each one as it was in training
  (RoPE is relative, so a document at position 600 reads as one at 0).  Measured by
  bench/documents.py: later report sections in one session, 60/60 fully correct with it, 0/60
  without (they copied the earlier sections' metrics).
Knows nothing about models; `within_documents` is told which token is BOS.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor


@lru_cache(maxsize=16)
def _rank_mask(L: int) -> Tensor:
    """The 2L x 2L rule in rank order (slot s holds rank s), built once per L."""
    return position_mask(torch.arange(L)[None])[0]  # (2L, 2L)


def training_mask(L: int, valid: Tensor | None = None) -> Tensor:
    """Training mask in rank order.

    valid: (B, L) bool in RANK order (False = padding), or None.
    Returns (2L, 2L) when valid is None, else (B, 2L, 2L).  Padding rows and columns are
    cleared, except each padding row keeps its own diagonal entry so that softmax never sees an
    all-masked row (those rows' outputs are never used).
    """
    base = _rank_mask(L)
    if valid is None:
        return base.clone()  # the lru-cached tensor itself must never reach a caller
    return _clear_padding(base.to(valid.device)[None], valid)


def position_mask(rank: Tensor, valid: Tensor | None = None) -> Tensor:
    """The same rule in POSITION space, without permuting the data.

    rank: (B, L) long, rank[b, i] = place of position i in the generation order.
    Returns (B, 2L, 2L) over [clean positions | noisy positions].
    """
    B, L = rank.shape
    ri, rj = rank[:, :, None], rank[:, None, :]  # query rank, key rank
    cc = rj <= ri  # clean -> clean: causal in generation order, incl. itself
    nc = rj < ri  # noisy -> clean: strictly earlier ranks
    nn = torch.eye(L, dtype=torch.bool, device=rank.device).expand(B, L, L)  # noisy -> noisy: itself
    cn = torch.zeros(B, L, L, dtype=torch.bool, device=rank.device)  # clean -> noisy: never
    mask = torch.cat([torch.cat([cc, cn], 2), torch.cat([nc, nn], 2)], 1)  # (B, 2L, 2L)
    return mask if valid is None else _clear_padding(mask, valid)


def _clear_padding(mask: Tensor, valid: Tensor) -> Tensor:
    """mask: (B|1, 2L, 2L); valid: (B, L) in the mask's slot order.  A padding slot (in both
    streams) is nobody's key and sees nothing but its own diagonal entry."""
    v2 = torch.cat([valid, valid], dim=1)  # (B, 2L)
    eye = torch.eye(v2.shape[1], dtype=torch.bool, device=valid.device)[None]
    return (mask & v2[:, :, None] & v2[:, None, :]) | (eye & ~v2[:, :, None])


def step_mask(n_cache: int, n_pending: int, n_masks: int, device: torch.device | str = "cpu") -> Tensor:
    """Inference mask for one fused step over [cache C | pending m | masks n].

    Returns (m + n, C + m + n): pending token j sees the cache and pending 0..j (the order they
    are listed in, i.e. commit order); every mask sees the cache, all pending tokens and itself.
    With n_masks = 0 this is a causal prefill; with n_cache = 0 it is the uncached reference.
    """
    C, m, n = n_cache, n_pending, n_masks
    mask = torch.zeros(m + n, C + m + n, dtype=torch.bool, device=device)
    mask[:, :C] = True
    mask[:m, C:C + m] = torch.ones(m, m, dtype=torch.bool, device=device).tril()
    mask[m:, C:C + m] = True
    mask[m:, C + m:] = torch.eye(n, dtype=torch.bool, device=device)
    return mask


def within_documents(mask: Tensor, key_pos: Tensor, key_tok: Tensor, query_pos: Tensor, bos_id: int | None) -> Tensor:
    """mask: (T, S) bool over S keys; key_pos, key_tok: (S,) long; query_pos: (T,) long.
    A query at position q sees only keys at positions >= its document's start: the position of
    the last BOS at or before q among the keys it already sees (never one committed after it:
    a step-by-step decode and one causal prefill of its ledger must give a token the same
    start, model/decode.py invariant I5).  bos_id: the document-start token (cfg.doc_start_id);
    None: no document boundaries, the mask as it is.  Returns the narrowed mask."""
    if bos_id is None:
        return mask
    is_bos = key_tok == bos_id  # (S,)
    # one document from position 0 (or none): nothing to narrow.  Asked on the CPU only: on a GPU
    # the answer would cost a device sync per forward, more than the masking it saves
    if mask.device.type == "cpu" and not bool((is_bos & (key_pos > 0)).any()):
        return mask
    seen = mask & is_bos[None, :] & (key_pos[None, :] <= query_pos[:, None])  # (T, S) BOS keys q sees
    start = torch.where(seen, key_pos[None, :], torch.full_like(key_pos, -1)[None, :]).amax(dim=1)  # (T,)
    return mask & (key_pos[None, :] >= start[:, None])
