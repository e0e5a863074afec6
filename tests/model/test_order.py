"""I3: the staggered order sampler."""

import torch

from model.order import ranks, reveal_times, sample_orders, window_params


def _targets(B: int, L: int, prompt: int, pad: int) -> torch.Tensor:
    t = torch.zeros(B, L, dtype=torch.bool)
    t[:, prompt: L - pad] = True
    return t


def test_d1_gives_the_identity() -> None:
    perm = sample_orders(_targets(8, 40, 5, 3), d=1)
    assert torch.equal(perm, torch.arange(40).expand(8, 40))


def test_displacement_is_below_smax_and_grows_with_d() -> None:
    g = torch.Generator().manual_seed(0)
    L, means = 128, []
    for d in (2, 4, 8):
        perm = sample_orders(_targets(64, L, 0, 0), d=d, generator=g)
        disp = (ranks(perm) - torch.arange(L)).abs()
        assert int(disp.max()) < 2 * d, f"d={d}: max displacement {int(disp.max())} >= smax"
        means.append(float(disp.float().mean()))
        assert not torch.equal(perm, torch.arange(L).expand_as(perm)), "d > 1 shuffles locally"
    assert means[0] < means[1] < means[2], means


def test_prompt_first_padding_last_in_positional_order() -> None:
    g = torch.Generator().manual_seed(3)
    L, P, pad = 50, 7, 9
    perm = sample_orders(_targets(32, L, P, pad), d=4, generator=g)
    assert torch.equal(perm[:, :P], torch.arange(P).expand(32, P))
    assert torch.equal(perm[:, L - pad:], torch.arange(L - pad, L).expand(32, pad))
    assert torch.equal(perm.sort(1).values, torch.arange(L).expand(32, L)), "a permutation"


def test_reveal_times_lie_in_their_windows() -> None:
    L, d, smax = 64, 4, 8
    b, k = window_params(L, d, smax)
    assert 0 < b < 1 and k > 0
    # window width in position units is exactly smax
    assert abs(b * (L - 1) / (1 - b) - smax) < 1e-9
    t = reveal_times(L, d, smax, (100,), torch.Generator().manual_seed(0))
    loc = (1 - b) * (L - 1 - torch.arange(L, dtype=torch.float64)) / (L - 1)
    assert bool(((t >= loc) & (t <= loc + b)).all())


def test_sampler_is_reproducible_by_generator() -> None:
    t = _targets(4, 32, 3, 2)
    a = sample_orders(t, 4, generator=torch.Generator().manual_seed(9))
    b = sample_orders(t, 4, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)


def test_with_valid_every_non_target_is_context_wherever_it_stands() -> None:
    # an infill row: context, a hole, context, a hole, context, then padding
    L = 24
    target = torch.zeros(16, L, dtype=torch.bool)
    target[:, 4:8] = True
    target[:, 12:15] = True
    valid = torch.ones(16, L, dtype=torch.bool)
    valid[:, 20:] = False
    perm = sample_orders(target, d=2, generator=torch.Generator().manual_seed(1), valid=valid)
    context = [p for p in range(20) if not 4 <= p < 8 and not 12 <= p < 15]
    assert torch.equal(perm[:, : len(context)], torch.tensor(context).expand(16, len(context)))
    assert torch.equal(perm[:, 20:], torch.arange(20, L).expand(16, 4)), "padding last"
    holes = perm[:, len(context): 20]
    assert torch.equal(holes.sort(1).values, torch.tensor([4, 5, 6, 7, 12, 13, 14]).expand(16, 7))
    # without valid, the same row's right-hand context would be ordered among the targets
    assert torch.equal(sample_orders(_targets(4, L, 5, 2), d=2, generator=torch.Generator().manual_seed(2),
                                     valid=torch.arange(L).expand(4, L) < L - 2),
                       sample_orders(_targets(4, L, 5, 2), d=2, generator=torch.Generator().manual_seed(2)))
