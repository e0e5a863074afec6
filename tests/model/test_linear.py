"""model/linear.py, model/rowdot.py: a row's bits do not depend on the rows beside it in the
product, nor on the threads that run it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model import rowdot, shipped
from model.config import ModelConfig
from model.linear import Linear, blas_rows, fused, invariant_threads, least_rows, min_rows, served

KERNEL = pytest.mark.skipif(rowdot.lib() is None, reason="no row-invariant kernel here (no AVX2+FMA or no gcc)")
AVX2_KINDS = {torch.float32: 5, torch.bfloat16: 6}  # what a CPU without AVX-512 runs


@pytest.fixture(params=[1, 2])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """One torch thread (a worker's default) and two."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(params=["kernel", "avx2", "dot", "padded"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every way a Linear makes a CPU product row-invariant: the kernel in this CPU's kinds, the
    AVX2 kinds (what a CPU without AVX-512 runs: packed weights, 5 and 6), the AVX2 dot order
    over weights in place (kind 0: what such a CPU ran before), and (where the kernel is absent)
    the BLAS padded to its minimum."""
    if request.param != "padded" and rowdot.lib() is None:
        pytest.skip("no row-invariant kernel here")
    if request.param == "avx2" and rowdot.kinds() == AVX2_KINDS:
        pytest.skip("this CPU's kinds are the AVX2 kinds: the same products as the path 'kernel'")
    if request.param == "avx2":
        monkeypatch.setattr(rowdot, "kinds", lambda: AVX2_KINDS)
    if request.param == "dot":
        monkeypatch.setattr(rowdot, "kinds", lambda: {torch.float32: 0, torch.bfloat16: 0})
    if request.param == "padded":
        monkeypatch.setattr("model.linear.served", lambda dtype: False)
    return str(request.param)


def shapes(cfg: ModelConfig) -> list[tuple[int, int]]:
    """A model's linear layers as (in, out): q, k and v, o, gate and up, down, the vocabulary."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return sorted({(d, q), (d, kv), (q, d), (d, cfg.d_ff), (cfg.d_ff, d), (d, cfg.vocab_size)})


QWEN_06B = ModelConfig(name="qwen3-0.6b", vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
                       head_dim=128, d_ff=3072)
QWEN_17B = ModelConfig(name="qwen3-1.7b", vocab_size=151936, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8,
                       head_dim=128, d_ff=6144)
#: every linear shape of the shipped model and of both Qwen3 models, each at its full in_features
#: and at most its first WIDEST output columns.  The rule: an output's bits depend on in_features
#: (its reduction's length and order) and on how the rows and columns are tiled, never on how
#: many columns lie beyond a few tiles: each output column reads only its own weight row and the
#: input row (model/rowdot.c, model/packed.c), whatever the columns beside it or where the
#: threads split them.  519 columns hold every tiling's cases: 32 panels of 16 and a tail of 7
#: (kinds 5 and 6; at 2 threads 8 chunks of 4 or 5 panels: whole groups of NP56's panels), 8 panels
#: of 64 and 7 (kind 3), 21 units of 24 and 15 (kinds 0 and 1).  The full width is checked at a
#: few row counts by test_the_whole_vocabulary_is_row_invariant.
WIDEST = 519
SHAPES = sorted({(k, min(n, WIDEST)) for cfg in (ModelConfig.from_json((shipped.SHIPPED / "config.json").read_text()),
                                                QWEN_06B, QWEN_17B) for k, n in shapes(cfg)})


def layer(k: int, n: int, dtype: torch.dtype, seed: int, bias: bool = False) -> Linear:
    lin = nn.utils.skip_init(Linear, k, n, bias=bias)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * k ** -0.5)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
    return lin.to(dtype).requires_grad_(False)


@KERNEL
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, n", SHAPES)
def test_every_row_has_its_bits_at_any_row_count_offset_and_thread_count(dtype: torch.dtype, k: int, n: int) -> None:
    """Rows 1..64, at the start and the end of a 64-row product, at 1 and 2 threads: each
    row's bits are those it has in the 64-row product at 1 thread; and close to F.linear.  In
    this CPU's kinds (the AVX2 kind: test_rows_round_alike_in_products_of_any_size).  Every
    shape at its full in_features, its columns cut to WIDEST with a tail: a column's bits do not
    depend on the columns beyond a few tiles (SHAPES)."""
    lin = layer(k, n, dtype, seed=k * 7 + n)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(n)).to(dtype)
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(1)
            full = lin(x)  # (64, n)
            torch.set_num_threads(2)
            assert torch.equal(lin(x), full), "two threads give the 64-row product other bits"
            for m in range(1, 65):
                for t in (1, 2):
                    torch.set_num_threads(t)
                    for a in {0, 64 - m}:
                        assert torch.equal(lin(x[a:a + m]), full[a:a + m]), f"{m} rows at {a}, {t} thread(s)"
            ref = F.linear(x.float(), lin.weight.float())
    finally:
        torch.set_num_threads(before)
    assert full.dtype == dtype
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(full.float(), ref, **tol)  # type: ignore[arg-type]


@KERNEL
def test_the_whole_vocabulary_is_row_invariant() -> None:
    """The Qwen3 vocabulary projection at its full 151936 columns, bf16 (its weights' dtype in
    the released models): 1, 3 and 8 rows at 1 and 2 threads against the 16-row product."""
    lin = layer(1024, 151936, torch.bfloat16, seed=1)
    x = torch.randn(16, 1024, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(2)
            full = lin(x)  # (16, 151936)
            for t in (1, 2):
                torch.set_num_threads(t)
                for m, a in ((1, 0), (1, 15), (3, 6), (8, 8)):
                    assert torch.equal(lin(x[a:a + m]), full[a:a + m]), f"{m} rows at {a}, {t} thread(s)"
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(full[:, :4096].float(), F.linear(x.float(), lin.weight[:4096].float()),
                               rtol=1e-2, atol=1e-2)




@pytest.mark.parametrize("kind", sorted(rowdot.PACKED))
@pytest.mark.parametrize("k, n", [(33, 1), (1001, 63), (64, 65), (7, 130), (3072, 129)])
def test_packed_rows_have_their_bits_at_any_shape(kind: int, k: int, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed kinds (model/packed.c: bf16 3, fp32 5, bf16 6, bf16 7): an odd k (kind 3: its
    last pair half zero; kind 7: a block padded), columns past a panel, one column, row tiles of
    every size: every row's bits alone, among others and at 1 and 2 threads, packed by the
    caller or on the fly; and the product itself to the dtype's tolerance."""
    if not rowdot.runs(kind):
        pytest.skip(f"this CPU does not run kind {kind}")
    dtype = rowdot.PACKED[kind]
    monkeypatch.setattr(rowdot, "kinds", lambda: {torch.float32: 5, torch.bfloat16: 6} | {dtype: kind})
    g = torch.Generator().manual_seed(k + n)
    x = torch.randn(37, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    full = rowdot.product(x, w, 2, packed=rowdot.pack(w))
    for t in (1, 2):
        for a, m in ((0, 1), (5, 1), (2, 6), (0, 13), (7, 4), (3, 16), (1, 33), (0, 37)):
            assert torch.equal(rowdot.product(x[a:a + m], w, t), full[a:a + m]), (t, a, m)
    tol = dict(rtol=1e-5, atol=1e-5 * k ** 0.5) if dtype == torch.float32 else dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(full, x.float() @ w.float().T, **tol)  # type: ignore[arg-type]


def test_fp32_packed_is_the_sum_in_k_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kind 5's order, stated: each output is fma(x[p], w[p], acc) for p = 0, 1, .. in turn,
    nothing else, by AVX2's 8 columns a vector and by AVX-512's 16 alike.  Checked against that
    loop in float64: the product of two fp32 is exact there, and so is its sum with the fp32
    accumulator for these operands (exponents close), so rounding it once to fp32 is one fma."""
    if rowdot.lib() is None:
        pytest.skip("no row-invariant kernel here")
    monkeypatch.setattr(rowdot, "kinds", lambda: {torch.float32: 5, torch.bfloat16: 6})
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(11, 37, generator=g), torch.randn(133, 37, generator=g)
    want = torch.zeros(11, 133, dtype=torch.float32)
    for p in range(37):  # a float64 product of two fp32 is exact; + acc rounded once to fp32: an fma
        want = (x[:, p:p + 1].double() * w[:, p].double() + want.double()).float()
    dll = rowdot.lib()
    assert dll is not None
    try:
        for zmm in (0, 1):  # AVX2's code, then AVX-512's where the CPU has it
            dll.packed_avx512(zmm)
            for a, m in ((0, 1), (1, 2), (2, 3), (0, 4), (3, 5), (0, 6), (4, 7), (1, 8), (0, 11)):
                assert torch.equal(rowdot.product(x[a:a + m], w, 1), want[a:a + m]), (zmm, a, m)
    finally:
        dll.packed_avx512(1)


def test_bf16_widened_has_the_bits_of_fp32_over_the_widened_operands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kind 6 is kind 5 over its operands widened exactly to fp32, at every tile the rows and
    panels make (1-3 rows over several panels, 4-6 rows over one, a partial last panel)."""
    if rowdot.lib() is None:
        pytest.skip("no row-invariant kernel here")
    monkeypatch.setattr(rowdot, "kinds", lambda: {torch.float32: 5, torch.bfloat16: 6})
    g = torch.Generator().manual_seed(4)
    x = torch.randn(13, 301, generator=g).to(torch.bfloat16)
    w = torch.randn(133, 301, generator=g).to(torch.bfloat16)
    for a, m in ((0, 1), (1, 2), (3, 3), (0, 4), (2, 5), (0, 6), (0, 13)):
        got = rowdot.product(x[a:a + m], w, 1)
        assert torch.equal(got, rowdot.product(x[a:a + m].float(), w.float(), 1)), (a, m)


@KERNEL
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_bf16_output_is_the_fp32_one_rounded_as_torch_rounds(dtype: torch.dtype) -> None:
    """The kernel's bf16 output is its fp32 output rounded to nearest even, bit for bit as
    `.to(torch.bfloat16)`: at ties, at overflow to inf, at subnormals; a NaN stays a NaN; a long
    k (sliced) and a tail."""
    g = torch.Generator().manual_seed(5)
    for k, n in ((3100, 40), (1024, 96), (40, 7)):
        x = torch.randn(9, k, generator=g).to(dtype)
        w = torch.randn(n, k, generator=g).to(dtype)
        x[0] *= 1e38  # products that overflow fp32, of both signs: inf - inf, a NaN
        x[3] = x[3].abs() * 1e36  # a positive sum past fp32's largest: inf
        w[0] = w[0].abs()
        x[1] *= 1e-30  # sums in bf16's subnormal range
        x[2, 0] = float("nan")
        got, want = rowdot.product(x, w, 2, out=torch.bfloat16), rowdot.product(x, w, 2).to(torch.bfloat16)
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any() and want.isinf().any(), (k, n)
        real = ~want.isnan()
        assert torch.equal(got[real].view(torch.int16), want[real].view(torch.int16)), (k, n)
    ties = torch.tensor([[1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8), 3.3895e38]], dtype=torch.float32)
    eye = torch.eye(4, dtype=torch.float32)  # x times the identity: the values themselves, rounded
    assert torch.equal(rowdot.product(ties, eye, 1, out=torch.bfloat16).view(torch.int16),
                       ties.to(torch.bfloat16).view(torch.int16))

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, n", [(128, 128), (128, 64), (512, 128), (128, 896), (100, 37)])
def test_rows_round_alike_in_products_of_any_size(path: str, threads: int, dtype: torch.dtype, k: int, n: int) -> None:
    """Both paths, 3-d and 2-d inputs, a bias, a width that is no multiple of a tile or of 8."""
    if path == "padded" and blas_rows(dtype, threads, k, n) is None:
        pytest.skip(f"this machine's {dtype} GEMM ({threads} threads) gives rows other bits whatever the padding")
    lin = layer(k, n, dtype, seed=k + n, bias=True)
    x = torch.randn(1, 300, k, generator=torch.Generator().manual_seed(k + n)).to(dtype)
    with torch.no_grad():
        full = lin(x)  # (1, 300, n)
        for m in (*range(1, 20), 33, 100):
            for a in (0, 2, 150):
                assert torch.equal(lin(x[:, a:a + m]), full[:, a:a + m]), f"{m} rows at {a}"
                assert torch.equal(lin(x[0, a:a + m]), full[0, a:a + m]), f"{m} rows at {a}, 2-d"
        torch.testing.assert_close(full, F.linear(x, lin.weight, lin.bias), rtol=2e-2, atol=2e-2)


def test_a_linear_is_an_nn_linear_to_checkpoints_and_autograd() -> None:
    """The same parameter names as nn.Linear (checkpoints load unchanged), a bias kept, and a
    product under autograd differentiable (the padded path: the padding takes no gradient)."""
    plain, ours = nn.Linear(8, 3), Linear(8, 3)
    ours.load_state_dict(plain.state_dict())
    assert list(ours.state_dict()) == list(plain.state_dict())
    x = torch.randn(2, 8, requires_grad=True)
    ours(x).sum().backward()
    assert x.grad is not None and x.grad.shape == (2, 8)
    torch.testing.assert_close(ours(x), plain(x))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), plain(x))
    assert ours(torch.randn(0, 8)).shape == (0, 3)


def test_the_kernel_serves_fp32_and_bf16_from_one_row() -> None:
    """Where the kernel is built every shape is row-invariant from one row, at any thread
    count; its identity names its source and flags."""
    if rowdot.lib() is None:
        assert rowdot.name() == "" and not served(torch.float32)
        pytest.skip("no row-invariant kernel here")
    assert rowdot.name().startswith("rowdot-") and rowdot.name().split("-")[2] == "".join(map(str, rowdot.kinds().values()))
    # AMX's sums are the hardware's: a CPU of another model is another kernel to a session
    assert rowdot.name().endswith(f"-cpu{rowdot._cpu()}") == (rowdot.kinds()[torch.bfloat16] == 7)
    for dtype in (torch.float32, torch.bfloat16):
        assert served(dtype) and min_rows(dtype, 2, 1024, 151936) == 1
    assert not served(torch.float16)


#: the linear layers of a Qwen3-0.6B-shaped model (bench/resume.py's qwen3-0.6b preset)
QWEN_SHAPES = tuple(shapes(QWEN_06B))


@pytest.mark.parametrize("most", [1, 2, 4])
def test_a_worker_runs_the_most_threads_that_keep_its_products_row_invariant(most: int) -> None:
    """invariant_threads: a count up to `most` at which every shape is row-invariant, torch left
    set to it, and no larger count up to `most` is (with the kernel: `most` itself; a padded
    BLAS may need fewer, workers/process.py)."""
    before = torch.get_num_threads()
    try:
        got = invariant_threads(QWEN_SHAPES, torch.float32, most)
        if got is None:
            assert torch.get_num_threads() == most
            pytest.skip("no thread count keeps these products row-invariant on this machine")
        assert 1 <= got <= most and torch.get_num_threads() == got
        assert least_rows(QWEN_SHAPES, torch.float32, got) is not None
        assert all(least_rows(QWEN_SHAPES, torch.float32, t) is None for t in range(got + 1, most + 1))
        if served(torch.float32):
            assert got == most and least_rows(QWEN_SHAPES, torch.float32, got) == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layers_give_each_layer_its_own_bits(dtype: torch.dtype) -> None:
    """fused(x, a, b, c): one product over the layers' weights side by side where the kernel
    reads packed weights, each output the very bits of its own layer's product, at 1 and 2
    threads and any row count; re-packed when a weight changes; layers with a bias (or under
    autograd) go one by one."""
    torch.manual_seed(5)
    layers = [Linear(96, n, bias=False).to(dtype) for n in (64, 40, 7)]
    x = torch.randn(9, 96).to(dtype)
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            for t in (1, 2):
                torch.set_num_threads(t)
                for m in (1, 2, 5, 9):
                    got = fused(x[:m], *layers)
                    for layer, y in zip(layers, got):
                        assert torch.equal(y, layer(x[:m])), (t, m, layer.out_features)
            layers[1].weight.mul_(2)  # a changed weight is packed again
            assert torch.equal(fused(x, *layers)[1], layers[1](x))
    finally:
        torch.set_num_threads(before)
    biased = [Linear(96, 8).to(dtype), Linear(96, 8).to(dtype)]
    with torch.no_grad():
        assert all(torch.equal(y, layer(x)) for y, layer in zip(fused(x, *biased), biased))
