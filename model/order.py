"""The staggered generation-order sampler used in training (reference note, section 1.3).

Each target position i gets a reveal time T_i inside its own window [loc_i, loc_i + b]; the
leftmost position has the latest window, so sorting by T_i descending gives a near
left-to-right order with local shuffling of about d/2 tokens.  Context (the leading run of
non-target tokens) comes first in positional order, padding (the trailing run) last.
Knows nothing about models or tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def window_params(L: int, d: int, smax: int) -> tuple[float, float]:
    """Window width b (in time units) and shape exponent k, solved from d and smax.
    The window spans exactly smax positions, so |rank - position| < smax always."""
    if not 1 <= d <= smax <= L:
        raise ValueError(f"need 1 <= d ({d}) <= smax ({smax}) <= L ({L})")
    A = d / (2 * L)  # the desired area under the masking curve
    if d in (1, smax):
        return 2 * A, 1.0
    b = smax / (L + smax - 1)
    return b, A / (b - A)


def reveal_times(L: int, d: int, smax: int, shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
    """First-hitting times T_i = loc_i + b (1 - U^(1/k)), U ~ Uniform(0, 1): (*shape, L) float64."""
    b, k = window_params(L, d, smax)
    i = torch.arange(L, dtype=torch.float64)
    loc = (1 - b) * (L - 1 - i) / max(L - 1, 1)  # (L,) leftmost position has the latest window
    u = torch.rand(*shape, L, generator=generator, dtype=torch.float64)
    return loc + b * (1 - u.pow(1 / k))


def sample_orders(target: Tensor, d: int, smax: int | None = None,
                  generator: torch.Generator | None = None, valid: Tensor | None = None) -> Tensor:
    """Sample one generation order per row.

    target: (B, L) bool, True where the token is a training target.  Without `valid`, the
    leading run of non-targets is context (first, positional order) and the trailing run is
    padding (last).  With valid (B, L) bool, every valid non-target is context, wherever it
    stands (an infill template's text right of a hole), and only invalid tokens are padding.
    Returns perm: (B, L) long, perm[b, r] = position generated at rank r.
    """
    B, L = target.shape
    smax = 2 * d if smax is None else smax
    dev = target.device
    idx = torch.arange(L, device=dev).expand(B, L)
    if d == 1:  # the window collapses to one position: exactly the identity (pure AR)
        t = -idx.to(torch.float64)
    else:  # drawn on the CPU (the generator's device), so orders do not depend on the device
        t = reveal_times(L, d, smax, (B,), generator).to(dev)
    first = torch.where(target.any(1), target.float().argmax(1), torch.full((B,), L, device=dev))  # (B,)
    last = L - 1 - target.flip(1).float().argmax(1)  # (B,) last target position
    if valid is None:
        context = idx < first[:, None]
        padding = idx > last[:, None]
    else:
        context = valid & ~target
        padding = ~valid
    t = torch.where(context, math.inf, t)
    t = torch.where(padding, -math.inf, t)
    # ties (the +-inf runs) are broken by position: a stable sort on (-t) keeps positional order
    return torch.sort(-t, dim=1, stable=True).indices


def ranks(perm: Tensor) -> Tensor:
    """Inverse permutation: rank[b, i] = place of position i in the order.  (B, L) long."""
    return torch.argsort(perm, dim=1)
