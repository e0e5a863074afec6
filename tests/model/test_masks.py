"""I1, I2 and the position-space form of the set-causal mask."""

import torch

from model.masks import position_mask, step_mask, training_mask, within_documents
from model.order import ranks, sample_orders


def _rule(q: int, k: int, L: int) -> bool:
    noisy_q, noisy_k, rq, rk = q >= L, k >= L, q % L, k % L
    if not noisy_q and not noisy_k:
        return rk <= rq
    if noisy_q and not noisy_k:
        return rk < rq
    if noisy_q and noisy_k:
        return rk == rq
    return False


def test_I1_training_mask_is_the_four_case_rule() -> None:
    L = 7
    m = training_mask(L)
    assert m.shape == (2 * L, 2 * L) and m.dtype == torch.bool
    for q in range(2 * L):
        for k in range(2 * L):
            assert bool(m[q, k]) == _rule(q, k, L), (q, k)
    for r in range(L):  # the noisy row of rank r: r clean entries + its own diagonal
        row = m[L + r]
        assert int(row[:L].sum()) == r and bool(row[L + r]) and int(row[L:].sum()) == 1
    assert not m[:L, L:].any(), "clean queries never see a noisy key"


def test_I1_example_from_the_reference_note() -> None:
    expected = ["1.......", "11......", "111.....", "1111....",
                "....1...", "1....1..", "11....1.", "111....1"]
    got = ["".join("1" if x else "." for x in row) for row in training_mask(4).tolist()]
    assert got == expected


def test_I1_padding_rows_and_columns_are_cleared() -> None:
    L = 6
    valid = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    m = training_mask(L, valid)
    assert m.shape == (2, 2 * L, 2 * L)
    pad = [4, 5, L + 4, L + 5]
    off_diag = ~torch.eye(2 * L, dtype=torch.bool)
    for s in pad:
        assert not (m[0, s] & off_diag[s]).any(), "a padding row sees only itself"
        assert not (m[0, :, s] & off_diag[:, s]).any(), "nobody attends to padding"
        assert m[0, s, s], "padding rows keep their diagonal (no all-masked softmax row)"
    assert torch.equal(m[1], training_mask(L))
    keep = [i for i in range(2 * L) if i not in pad]
    assert torch.equal(m[0][keep][:, keep], training_mask(L)[keep][:, keep])


def test_I2_step_mask_is_the_training_mask_restricted_to_ranks() -> None:
    L = 24
    full = training_mask(L)
    for C, mp, n in [(0, 0, 3), (5, 0, 4), (5, 3, 4), (0, 4, 2), (9, 2, 0), (3, 1, 1), (10, 6, 8)]:
        # queries: pending clean ranks C..C+m-1, then masks at noisy ranks C+m+j
        rows = list(range(C, C + mp)) + [L + C + mp + j for j in range(n)]
        cols = list(range(C + mp)) + [L + C + mp + j for j in range(n)]
        assert torch.equal(step_mask(C, mp, n), full[rows][:, cols]), (C, mp, n)


def test_position_space_mask_equals_permuted_rank_mask() -> None:
    g = torch.Generator().manual_seed(1)
    L = 16
    target = torch.ones(3, L, dtype=torch.bool)
    target[:, :3] = False
    target[1, 12:] = False
    perm = sample_orders(target, d=4, generator=g)
    valid = torch.ones(3, L, dtype=torch.bool)
    valid[1, 12:] = False
    rank_space = training_mask(L, valid.gather(1, perm))
    pos_space = position_mask(ranks(perm), valid)
    # slot s of the rank layout holds position perm[s] (in each stream)
    idx = torch.cat([perm, perm + L], dim=1)  # (B, 2L): rank slot -> position slot
    for b in range(3):
        assert torch.equal(rank_space[b], pos_space[b][idx[b]][:, idx[b]])


BOS = 2


def test_one_document_from_position_0_is_left_as_it_is() -> None:
    mask = step_mask(0, 6, 2)
    pos, tok = torch.arange(8), torch.tensor([BOS, 5, 6, 7, 8, 9, 1, 1])
    assert torch.equal(within_documents(mask, pos, tok, pos, BOS), mask)


def test_a_bos_starts_a_document_that_no_query_reads_across() -> None:
    # [doc A: BOS 5 6 | doc B: BOS 7 8] prefilled causally, then 2 masks of doc B
    mask = step_mask(0, 6, 2)
    pos, tok = torch.arange(8), torch.tensor([BOS, 5, 6, BOS, 7, 8, 1, 1])
    out = within_documents(mask, pos, tok, pos, BOS)
    assert torch.equal(out[:3], mask[:3])  # doc A's queries: unchanged
    assert not out[3:, :3].any()  # doc B's queries (clean and masks) see nothing of doc A
    assert torch.equal(out[3:, 3:], mask[3:, 3:])  # ... and all of their own document


def test_a_bos_committed_after_a_query_does_not_move_its_start() -> None:
    # commit order: position 9 (decoded early, out of order), then a BOS at position 5: the
    # query at 9 saw no BOS past 0 when it was committed, so it keeps seeing everything
    # (as it did step by step); a later query at 7 starts at the BOS
    pos, tok = torch.tensor([0, 1, 9, 5, 7]), torch.tensor([BOS, 4, 6, BOS, 8])
    mask = step_mask(0, 5, 0)
    out = within_documents(mask, pos, tok, pos, BOS)
    assert torch.equal(out[2], mask[2])
    assert out[4].tolist() == [False, False, True, True, True]  # keys at positions >= 5
