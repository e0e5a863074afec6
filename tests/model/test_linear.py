"""model/linear.py: a row's bits do not depend on the rows beside it in the product."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from model.linear import Linear, invariant_threads, least_rows, min_rows


@pytest.fixture(params=[1, 2])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """One torch thread (a worker's default) and two (torch_threads = 2: other kernels for few rows)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, n", [(128, 128), (128, 64), (512, 128), (128, 896)])
def test_rows_round_alike_in_products_of_any_size(threads: int, dtype: torch.dtype, k: int, n: int) -> None:
    if min_rows(dtype, threads, k, n) is None:
        pytest.skip(f"this machine's {dtype} GEMM ({threads} threads) gives rows other bits whatever the padding")
    g = torch.Generator().manual_seed(k + n)
    layer = Linear(k, n, bias=False).to(dtype)
    x = torch.randn(1, 300, k, generator=g).to(dtype)
    with torch.no_grad():
        full = layer(x)  # (1, 300, n)
        for m in (*range(1, 20), 33, 100):
            for a in (0, 2, 150):
                assert torch.equal(layer(x[:, a:a + m]), full[:, a:a + m]), f"{m} rows at {a}"
                assert torch.equal(layer(x[0, a:a + m]), full[0, a:a + m]), f"{m} rows at {a}, 2-d"


def test_a_linear_is_an_nn_linear_to_checkpoints_and_autograd() -> None:
    """The same parameter names as nn.Linear (checkpoints load unchanged), a bias kept, and a
    padded product differentiable: the padding takes no gradient."""
    plain, ours = nn.Linear(8, 3), Linear(8, 3)
    ours.load_state_dict(plain.state_dict())
    assert list(ours.state_dict()) == list(plain.state_dict())
    x = torch.randn(2, 8, requires_grad=True)
    ours(x).sum().backward()
    assert x.grad is not None and x.grad.shape == (2, 8)
    torch.testing.assert_close(ours(x), plain(x))
    assert ours(torch.randn(0, 8)).shape == (0, 3)


#: the linear layers of a Qwen3-0.6B-shaped model (bench/resume.py's qwen3-0.6b preset), the
#: vocabulary projection's width cut (the probe reads its first 4096 columns only)
QWEN_SHAPES = ((1024, 1024), (1024, 2048), (1024, 3072), (2048, 1024), (3072, 1024), (1024, 151936))


@pytest.mark.parametrize("most", [1, 2, 4])
def test_a_worker_runs_the_most_threads_that_keep_its_products_row_invariant(most: int) -> None:
    """invariant_threads: a count up to `most` at which every shape has a padding minimum, torch
    left set to it, and no larger count up to `most` has one (on this machine, two threads have
    none for 1024-wide products: the worker then runs one, workers/process.py)."""
    before = torch.get_num_threads()
    try:
        got = invariant_threads(QWEN_SHAPES, torch.float32, most)
        if got is None:
            assert torch.get_num_threads() == most
            pytest.skip("no thread count keeps these products row-invariant on this machine")
        assert 1 <= got <= most and torch.get_num_threads() == got
        assert least_rows(QWEN_SHAPES, torch.float32, got) is not None
        assert all(least_rows(QWEN_SHAPES, torch.float32, t) is None for t in range(got + 1, most + 1))
    finally:
        torch.set_num_threads(before)
