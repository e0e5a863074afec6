"""Linear layers whose every row gets the same bits in a product of any number of rows.

A batched forward (model/batch.py) runs the linear layers on all its sequences' tokens packed
into one product; the same sequence alone runs them on its own few rows; a restored session's
next step and a recomputed one differ in their products' row counts too.  Each row must round
alike in all of them, or a near-tie between two tokens (a confidence right at tau) could decode
differently.  On a CPU with AVX2 and FMA the product is the row-invariant kernel
(model/rowdot.py): every output element is reduced in one fixed order whatever the rows, the
tiles or the threads (split over output columns, never over the reduction), so a row's bits
are the same alone, in a batch and at any thread count, by construction; fp32 or bf16,
accumulated in fp32, a bf16 output rounded to nearest even.  Its kinds read the weight packed
into panels (model/packed.c), packed once and kept beside the weight, so such a model holds its
weights twice.  Where it is not available (no
compiler, another CPU) a BLAS product of fewer rows than this machine's invariant minimum is
padded with zero rows to it (the kernel is chosen by shapes, never by values): the minimum is
probed once per (dtype, threads, shape), a model pads a short forward once to its layers'
largest minimum (model/transformer.py), and a Linear pads what is still short.  Autograd
(training) takes the padded path.  Other devices run F.linear as it is (their kernels are not
batch-invariant: the GPU path agrees to float tolerance, model/batch.py).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import rowdot

#: the probe: row counts checked, where the rows sit inside a larger product, the minimums tried,
#: and the widest output it probes in full (a vocabulary of 150k columns would take seconds: the
#: kernel for few rows is taken by the row count, and a wider product by its first columns' kernel)
_COUNTS = (*range(1, 17), 20, 24, 32, 40, 48, 64, 96, 160)
_OFFSETS = (0, 3, 13)
_CANDIDATES = (1, 2, 4, 8, 12, 16, 24, 32, 48)
_WIDEST = 4096


def served(dtype: torch.dtype) -> bool:
    """Does the row-invariant kernel (model/rowdot.c) run this dtype's CPU products here?"""
    return dtype in rowdot.DTYPES and rowdot.lib() is not None


def min_rows(dtype: torch.dtype, threads: int, k: int, n: int) -> int | None:
    """The fewest rows from which a (rows, k) x (k, n) CPU product, as Linear runs it without
    autograd, gives each row the bits it gets inside any larger product: 1 where the kernel
    serves the dtype, else the BLAS's padding minimum (blas_rows)."""
    return 1 if served(dtype) else blas_rows(dtype, threads, k, n)


@lru_cache(maxsize=None)
def blas_rows(dtype: torch.dtype, threads: int, k: int, n: int) -> int | None:
    """The fewest rows from which a (rows, k) x (k, n) BLAS product (F.linear) on this CPU gives
    each row the bits it gets inside any larger product, a product of fewer padded to it with
    zero rows doing the same; None if no candidate up to 48 does (then rows agree only to float
    tolerance)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(min(n, _WIDEST), k, generator=g).to(dtype)
    x = torch.randn(max(_COUNTS) + max(_OFFSETS) + 64, k, generator=g).to(dtype)
    full = F.linear(x, w)

    def same(m: int, pad: int = 0) -> bool:
        for a in _OFFSETS:
            rows = x[a:a + m]
            if pad > m:
                rows = torch.cat([rows, rows.new_zeros(pad - m, k)])
            if not torch.equal(F.linear(rows, w)[:m], full[a:a + m]):
                return False
        return True

    good = {m: same(m) for m in _COUNTS}
    for r in _CANDIDATES:
        if all(good[m] for m in _COUNTS if m >= r) and all(same(m, r) for m in _COUNTS if m < r):
            return r
    return None


@lru_cache(maxsize=None)
def least_rows(shapes: tuple[tuple[int, int], ...], dtype: torch.dtype, threads: int) -> int | None:
    """The fewest rows from which products of every (k, n) shape of `shapes` (a model's linear
    layers) are row-invariant: the largest of their min_rows; None if one has none."""
    need = [min_rows(dtype, threads, k, n) for k, n in shapes]
    return None if None in need else max((r for r in need if r is not None), default=1)


def invariant_threads(shapes: tuple[tuple[int, int], ...], dtype: torch.dtype, most: int) -> int | None:
    """The most torch threads, up to `most`, at which products of every (k, n) of `shapes` are
    row-invariant (least_rows), torch left set to it; None (torch left at `most`) where no count
    is.  Where the kernel serves the dtype every count is (`most`); a padded BLAS may need
    fewer, or have none."""
    for threads in range(most, 0, -1):
        torch.set_num_threads(threads)
        if least_rows(shapes, dtype, threads) is not None:
            return threads
    torch.set_num_threads(most)
    return None


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state_dict) whose rows round alike in products of any
    number of rows on a CPU: the row-invariant kernel where it serves, else a product of fewer
    than blas_rows rows padded to it (and always so under autograd)."""

    _fused: Tensor  # fused(): the panels of this layer's and the next ones' weights side by side
    _fused_key: object = None

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // self.in_features
        if x.device.type != "cpu" or rows == 0:
            return F.linear(x, self.weight, self.bias)
        w = self.weight
        if _on_kernel(x, (w,)):
            flat = x.reshape(rows, self.in_features).contiguous()  # (rows, in)
            w, threads = w.contiguous(), torch.get_num_threads()
            if self.bias is None:  # written in x's dtype (bf16: rounded to nearest even by the kernel)
                y = rowdot.product(flat, w, threads, out=x.dtype, packed=self._packed(w))
            else:  # the bias added in fp32, then rounded
                y = rowdot.product(flat, w, threads, packed=self._packed(w))
                y = (y + self.bias.to(torch.float32)).to(x.dtype)
            return y.reshape(*x.shape[:-1], self.out_features)
        r = blas_rows(x.dtype, torch.get_num_threads(), self.in_features, self.out_features)
        if r is None or rows >= r:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features)
        padded = torch.cat([flat, flat.new_zeros(r - rows, self.in_features)])  # (r, in)
        return F.linear(padded, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], self.out_features)

    def _packed(self, w: Tensor) -> Tensor | None:
        """The weight's panels where this CPU's kind reads them (model/packed.c), packed once and
        again only when the weight or the kind changes (its storage, version or shape); else
        None."""
        if not rowdot.packs(w.dtype):
            return None
        key = (_held(w), rowdot.kinds()[w.dtype])
        if getattr(self, "_pack_key", None) != key:
            self._pack, self._pack_key = rowdot.pack(w), key
        return self._pack


def fused(x: Tensor, *layers: Linear) -> list[Tensor]:
    """x through several bias-free Linears of its width: where this CPU's kernel reads packed
    weights, one product over their panels side by side (one call and one read of x; an output
    column is reduced as in its own layer's product, so each output has the bits that layer
    gives alone); else each layer in turn.  The panels are packed once, on the first layer, and
    again only when a weight or the kind changes."""
    first = layers[0]
    rows = x.numel() // first.in_features
    w = first.weight
    if (x.device.type != "cpu" or rows == 0 or any(m.bias is not None for m in layers)
            or not _on_kernel(x, [m.weight for m in layers]) or not rowdot.packs(x.dtype)):
        return [m(x) for m in layers]
    key = (tuple(_held(m.weight) for m in layers), rowdot.kinds()[w.dtype])
    if first._fused_key != key:
        first._fused, first._fused_key = rowdot.pack(torch.cat([m.weight for m in layers])), key
    widths = [m.out_features for m in layers]
    flat = x.reshape(rows, first.in_features).contiguous()
    y = rowdot.product(flat, w, torch.get_num_threads(), out=x.dtype, packed=first._fused, n=sum(widths))
    return [part.reshape(*x.shape[:-1], n) for part, n in zip(y.split(widths, dim=1), widths)]


def _on_kernel(x: Tensor, weights: tuple[Tensor, ...] | list[Tensor]) -> bool:
    """Does the row-invariant kernel run x times these weights: no autograd, and one dtype it
    serves?"""
    grad = torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights))
    return not grad and all(w.dtype == x.dtype for w in weights) and served(x.dtype)


def _held(w: Tensor) -> tuple[int, int, tuple[int, ...]]:
    """What a weight's packed panels were made from: its storage, version and shape (packed again
    when one changes)."""
    return w.data_ptr(), w._version, tuple(w.shape)
