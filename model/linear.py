"""Linear layers whose every row gets the same bits in a product of any number of rows.

A batched forward (model/batch.py) runs the linear layers on all its sequences' tokens packed
into one product; the same sequence alone runs them on its own few rows.  A CPU BLAS takes
another kernel for a product of very few rows (here, fp32 with one thread: fewer than 4; with
two threads also 5-7 and 9-11), so a short step's rows round differently alone than in a batch,
and a near-tie between two tokens, or a confidence right at tau, could then decode differently.
So a product of fewer rows than this machine's invariant minimum is padded to it with zero rows
(the kernel is chosen by shapes, never by values), and a row's bits are then those it gets in
any larger product.  The minimum is probed once per (dtype, threads, shape) on the CPU; a model
pads a short forward once to its layers' largest minimum (model/transformer.py), and a Linear
pads what is still short (the vocabulary projection of a step's few masks).  Other devices are
not padded (their kernels are not batch-invariant anyway: the GPU path agrees to
float tolerance, model/batch.py).

What it buys, measured with the padding off (this Linear a plain F.linear, SetDLM.forward
unpadded): 16 of the 41 batch-vs-alone tests (tests/model/test_batch*.py, test_pool.py) then
see a step's logits differ in their last bits, the shipped model's narratives and agent calls
among them; their tokens stayed the same, but only as long as no near-tie comes.  What it
costs: a batch-1 AR turn of the shipped model (fp32, one thread, 98 forwards) took 0.86-0.93 s
padded, 0.80-0.82 s not, on a busy machine: about 5-10%.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: the probe: row counts checked, where the rows sit inside a larger product, the minimums tried,
#: and the widest output it probes in full (a vocabulary of 150k columns would take seconds: the
#: kernel for few rows is taken by the row count, and a wider product by its first columns' kernel)
_COUNTS = (*range(1, 17), 20, 24, 32, 40, 48, 64, 96, 160)
_OFFSETS = (0, 3, 13)
_CANDIDATES = (1, 2, 4, 8, 12, 16, 24, 32, 48)
_WIDEST = 4096


@lru_cache(maxsize=None)
def min_rows(dtype: torch.dtype, threads: int, k: int, n: int) -> int | None:
    """The fewest rows from which a (rows, k) x (k, n) product on this CPU gives each row the
    bits it gets inside any larger product, a product of fewer padded to it with zero rows doing
    the same; None if no candidate up to 48 does (then rows agree only to float tolerance)."""
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
    is.  Why a worker asks: with two threads this CPU's BLAS takes a few-row kernel for every
    shape of a Qwen3-size model (1024 wide) at any row count up to 48, so no padding makes a
    row's bits the same alone and in a batch, restored and recomputed; with one thread 16 rows
    do (bench/resume.py's qwen3-0.6b preset, 2026-12-03)."""
    for threads in range(most, 0, -1):
        torch.set_num_threads(threads)
        if least_rows(shapes, dtype, threads) is not None:
            return threads
    torch.set_num_threads(most)
    return None


class Linear(nn.Linear):
    """nn.Linear (the same parameters and state_dict) whose rows round alike in products of any
    number of rows on a CPU: a product of fewer than min_rows rows is padded to it."""

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // self.in_features
        if x.device.type != "cpu" or rows == 0:
            return F.linear(x, self.weight, self.bias)
        r = min_rows(x.dtype, torch.get_num_threads(), self.in_features, self.out_features)
        if r is None or rows >= r:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features)
        padded = torch.cat([flat, flat.new_zeros(r - rows, self.in_features)])  # (r, in)
        return F.linear(padded, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], self.out_features)
