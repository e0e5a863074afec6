"""model/pointwise.c through model/rowdot.py: a layer's RMSNorms and rotary embedding, each row
in one order, so a row's bits are the same alone, among others and at any thread count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import rowdot
from model.transformer import apply_rope, rope_rows

pytestmark = pytest.mark.skipif(rowdot.lib() is None, reason="no row-invariant kernel here (no AVX2+FMA or no gcc)")
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1024, 128, 37])
def test_a_norm_row_has_its_bits_alone_and_is_rms_norm(dtype: torch.dtype, d: int) -> None:
    """Every row alone, at 1 and 2 threads, as in the 40-row call; and the RMSNorm (fp32 inside,
    cast to the dtype before the weight) to one rounding of the dtype."""
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(40, d, generator=g) * 3).to(dtype)
    w = (torch.randn(d, generator=g) * 0.2 + 1).to(dtype)
    full = rowdot.norm(x, w, 1e-6, 2)
    assert full is not None and full.dtype == dtype
    for t in (1, 2):
        for a, m in ((0, 1), (7, 1), (3, 5), (0, 40)):
            part = rowdot.norm(x[a:a + m], w, 1e-6, t)
            assert part is not None and torch.equal(part, full[a:a + m]), (t, a, m)
    want = w * F.rms_norm(x.float(), (d,), eps=1e-6).to(dtype)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(full, want, **tol)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_rope_is_the_heads_norms_then_apply_rope_rounding_for_rounding(dtype: torch.dtype) -> None:
    """q and k as views of one fused product's output (rows 4096 apart): their heads' norms (the
    kernel's), then RoPE with apply_rope's very roundings; a row alone and at 2 threads the same."""
    T, H, Hkv, D = 21, 16, 8, 128
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(1, T, (H + 2 * Hkv) * D, generator=g).to(dtype)
    q, k = qkv[..., :H * D], qkv[..., H * D:(H + Hkv) * D]
    wq, wk = ((torch.randn(D, generator=g) * 0.1 + 1).to(dtype) for _ in range(2))
    ang = torch.randn(1, T, D // 2, generator=g) * 50
    cs = rope_rows(ang.cos().to(dtype), ang.sin().to(dtype))
    cos, sin = cs[0][:, :, 0, :D // 2], cs[1][:, :, 0, D // 2:]
    got = rowdot.norm_rope(q, k, wq, wk, cos, sin, 1e-6, 1)
    assert got is not None
    nq = rowdot.norm(q.reshape(1, T, H, D).contiguous(), wq, 1e-6, 1)
    nk = rowdot.norm(k.reshape(1, T, Hkv, D).contiguous(), wk, 1e-6, 1)
    assert nq is not None and nk is not None
    assert torch.equal(got[0], apply_rope(nq, cs)) and torch.equal(got[1], apply_rope(nk, cs))
    two = rowdot.norm_rope(q, k, wq, wk, cos, sin, 1e-6, 2)
    assert two is not None and torch.equal(two[0], got[0]) and torch.equal(two[1], got[1])
    for t in (0, 9, T - 1):
        one = rowdot.norm_rope(q[:, t:t + 1], k[:, t:t + 1], wq, wk, cos[:, t:t + 1], sin[:, t:t + 1], 1e-6, 1)
        assert one is not None and torch.equal(one[0][0, 0], got[0][0, t]) and torch.equal(one[1][0, 0], got[1][0, t])


def test_rows_that_do_not_lie_evenly_apart_are_left_to_torch() -> None:
    """A view whose rows cannot be walked by one stride: None, and the caller computes it."""
    x = torch.randn(4, 6, 16)[:, ::2]  # (4, 3, 16): rows 32 apart within a block, 96 between
    assert rowdot.norm(x.transpose(0, 1), torch.ones(16), 1e-6, 1) is None
