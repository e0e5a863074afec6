"""model/attend.c through model/attention.py: a query row's bits depend on nothing but its query
and the keys it attends, and agree with torch's SDPA to float tolerance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import rowdot
from model.attention import additive, heads

pytestmark = pytest.mark.skipif(rowdot.lib() is None, reason="model/attend.c needs an x86-64 CPU with AVX2 and gcc")

#: (heads, key heads, head_dim): Qwen3's grouping, one head a key head, an odd group, a head_dim
#: that is no multiple of 16 (the scalar tails)
SHAPES = ((16, 8, 128), (4, 4, 32), (6, 2, 20))


def case(dtype: torch.dtype, H: int, Hkv: int, D: int, B: int = 2, T: int = 12, S: int = 40,
         seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g).to(dtype).transpose(1, 2)  # (B, H, T, D), as the model's views
    k = torch.randn(B, S, Hkv, D, generator=g).to(dtype).transpose(1, 2)
    v = torch.randn(B, S, Hkv, D, generator=g).to(dtype).transpose(1, 2)
    keep = torch.rand(B, T, S, generator=g) > 0.4
    keep[:, :, 0] = True  # every row attends at least one key
    return q, k, v, additive(keep, dtype, torch.device("cpu"))[:, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,D", SHAPES)
def test_agrees_with_sdpa(dtype: torch.dtype, H: int, Hkv: int, D: int) -> None:
    q, k, v, mask = case(dtype, H, Hkv, D)
    assert rowdot.attends(q, k, v, mask)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(), enable_gqa=True)
    got = heads(q, k, v, mask)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,D", SHAPES)
def test_a_row_has_its_bits_in_any_call(dtype: torch.dtype, H: int, Hkv: int, D: int) -> None:
    """Alone, among other rows and sequences, with more keys it does not attend, at 1 and 2
    threads: the same bits."""
    q, k, v, mask = case(dtype, H, Hkv, D)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = heads(q, k, v, mask)
        torch.set_num_threads(2)
        assert torch.equal(heads(q, k, v, mask), full), "two threads give other bits"
        for b, t in ((0, 0), (1, 5), (1, 11)):
            alone = heads(q[b:b + 1, :, t:t + 1], k[b:b + 1], v[b:b + 1], mask[b:b + 1, :, t:t + 1])
            assert torch.equal(alone, full[b:b + 1, :, t:t + 1]), f"row {(b, t)} alone has other bits"
        g = torch.Generator().manual_seed(1)
        extra = lambda x: torch.cat([x, torch.randn(*x.shape[:2], 9, D, generator=g).to(dtype)], 2)  # noqa: E731
        more = torch.cat([mask, torch.full((*mask.shape[:3], 9), float("-inf")).to(dtype)], 3)
        assert torch.equal(heads(q, extra(k), extra(v), more), full), "keys no row attends changed a row"
        shuffled = torch.cat([extra(k)[:, :, 40:], k], 2), torch.cat([extra(v)[:, :, 40:], v], 2)
        before_keys = torch.cat([torch.full((*mask.shape[:3], 9), float("-inf")).to(dtype), mask], 3)
        assert torch.equal(heads(q, *shuffled, before_keys), full), "keys no row attends, before its own"
    finally:
        torch.set_num_threads(before)


def test_autograd_and_other_masks_take_sdpa() -> None:
    q, k, v, mask = case(torch.float32, 4, 4, 32)
    assert not rowdot.attends(q.detach().requires_grad_(), k, v, mask)
    assert not rowdot.attends(q, k, v, mask > -1)  # a boolean mask
    with torch.no_grad():
        assert rowdot.attends(q.detach().requires_grad_(), k, v, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,D", SHAPES)
def test_sequences_packed_in_one_call_keep_each_rows_bits(dtype: torch.dtype, H: int, Hkv: int, D: int) -> None:
    """attend_ragged (a batch's sequences in one call, their keys read in place from a pool's
    slots, in any order): each row the very bits heads() gives it over its keys gathered, at 1
    and 2 threads, with sequences of different rows and keys."""
    g = torch.Generator().manual_seed(3)
    counts, sizes = [3, 1, 7, 2], [40, 17, 9, 33]
    pool_k = torch.randn(150, Hkv, D, generator=g).to(dtype)
    pool_v = torch.randn(150, Hkv, D, generator=g).to(dtype)
    slots = [torch.randperm(150, generator=g)[:s] for s in sizes]  # each sequence's slots, scattered
    qs = [torch.randn(c, H, D, generator=g).to(dtype) for c in counts]
    masks = []
    for c, s in zip(counts, sizes):
        keep = torch.rand(c, s, generator=g) > 0.3
        keep[:, 0] = True
        masks.append(additive(keep, dtype, torch.device("cpu")))
    want = [heads(q.transpose(0, 1)[None], pool_k[i][None].transpose(1, 2), pool_v[i][None].transpose(1, 2),
                  m[None, None])[0].transpose(0, 1) for q, i, m in zip(qs, slots, masks)]  # (c, H, D) each
    flat = torch.cat([m.flatten() for m in masks])
    before = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            got = rowdot.attend_ragged(torch.cat(qs), pool_k, pool_v, torch.cat(slots), counts, sizes, flat, t)
            assert torch.equal(got, torch.cat(want)), f"{t} thread(s)"
    finally:
        torch.set_num_threads(before)
