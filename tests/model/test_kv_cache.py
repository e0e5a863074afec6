"""KVCache: ledger bookkeeping, fork, and its bytes in the one K/V format (runtime/sessions/kv.py
segments: exact round trips, damage refused)."""

import pytest
import torch

from model.kv_cache import KVCache
from runtime.errors import CorruptState
from runtime.sessions import kv
from runtime.sessions.segments import HEADER
from tests.fakes import assert_same_cache

FP = "f" * 16


def _filled(n: int = 9, seed: int = 0) -> KVCache:
    g = torch.Generator().manual_seed(seed)
    c = KVCache.empty(n_layers=2, n_kv_heads=2, head_dim=4, capacity=2)
    for a in range(0, n, 3):  # several appends: exercises growth past the capacity
        m = min(3, n - a)
        c.append(torch.randn(2, m, 2, 4, generator=g), torch.randn(2, m, 2, 4, generator=g),
                 list(range(a, a + m)), [10 + i for i in range(a, a + m)])
    return c


def test_append_grows_and_keeps_the_ledger_aligned() -> None:
    c = _filled(9)
    assert c.length == 9 and c.capacity >= 9
    assert c.positions == list(range(9)) and c.tokens == [10 + i for i in range(9)]
    k0, v0 = c.layer(0)
    assert k0.shape == (9, 2, 4) and v0.shape == (9, 2, 4)


def test_rollback_and_fork_are_independent() -> None:
    c = _filled(9)
    f = c.fork(5)
    assert f.length == 5 and torch.equal(f.layer(1)[0], c.layer(1)[0][:5])
    f.append(torch.ones(2, 1, 2, 4), torch.ones(2, 1, 2, 4), [42], [7])
    assert c.length == 9 and c.positions[5] == 5, "the parent is untouched by the fork"
    c.rollback(3)
    assert c.length == 3 and c.positions == [0, 1, 2]
    assert f.positions == [0, 1, 2, 3, 4, 42]
    with pytest.raises(AssertionError):
        c.rollback(4)


@pytest.mark.parametrize("n", [1, 9])
def test_round_trip_through_segments_is_exact_and_byte_identical(n: int) -> None:
    c = _filled(n)
    blobs = kv.to_segments(c, 0, n, FP, 1 << 20)
    d = kv.from_segments(blobs, FP, c.positions, c.tokens)
    assert_same_cache(c, d)
    assert kv.to_segments(d, 0, n, FP, 1 << 20) == blobs
    assert kv.to_segments(c, 0, 0, FP, 1 << 20) == [], "no slots, no segments"


def test_a_bf16_cache_round_trips_in_half_the_bytes() -> None:
    c = _filled(9)
    h = KVCache(c.k.to(torch.bfloat16), c.v.to(torch.bfloat16), c.pos, c.tok, c.length)
    b32, b16 = kv.to_segments(c, 0, 9, FP, 1 << 20), kv.to_segments(h, 0, 9, FP, 1 << 20)
    assert sum(map(len, b16)) < 0.6 * sum(map(len, b32))
    d = kv.from_segments(b16, FP, h.positions, h.tokens)
    assert d.k.dtype == torch.bfloat16 and torch.equal(d.k[:, :9], c.k[:, :9].to(torch.bfloat16))
    assert_same_cache(h, d)


def test_damage_and_another_model_are_refused() -> None:
    """Every flipped byte and every truncation of a cache's segment (the format's own checks are
    tests/runtime/sessions/test_segments.py's), a missing segment, a foreign fingerprint."""
    c = _filled(4)
    (blob,) = kv.to_segments(c, 0, 4, FP, 1 << 20)
    damaged = [bytes(b ^ 0x5A if i == j else b for i, b in enumerate(blob)) for j in range(len(blob))]
    for bad in damaged + [blob[:n] for n in range(len(blob))] + [blob + b"\0"]:
        with pytest.raises(CorruptState):
            kv.from_segments([bad], FP, c.positions, c.tokens)
    with pytest.raises(CorruptState, match="of model"):
        kv.from_segments([blob], "0" * 16, c.positions, c.tokens)
    two = kv.to_segments(_filled(9), 0, 9, FP, HEADER.size + 4 * 2 * 2 * 2 * 4 * 4)  # 4 slots per segment
    with pytest.raises(CorruptState, match="does not follow"):
        kv.from_segments(two[1:], FP, list(range(5)), list(range(5)))
    with pytest.raises(CorruptState, match="ledger"):
        kv.from_segments([blob], FP, c.positions[:3], c.tokens[:3])


def test_scratch_never_touches_valid_slots_and_commit_keeps_a_prefix() -> None:
    c = _filled(5)
    before = c.fork()
    c.reserve(3)
    new = torch.full((3, 2, 4), 7.0)
    k_all, v_all = c.scratch(1, new, -new)
    assert k_all.shape == (8, 2, 4) and torch.equal(k_all[5:], new) and torch.equal(v_all[5:], -new)
    assert_same_cache(before, c)  # uncommitted scratch is invisible
    for i in range(2):  # a forward writes every layer's scratch before committing
        c.scratch(i, new, -new)
    c.commit([50, 51], [1, 2])  # keep the first 2 of the 3 scratch slots
    assert c.length == 7 and c.positions[-2:] == [50, 51] and torch.equal(c.layer(0)[0][5:], new[:2])
    with pytest.raises(AssertionError):
        c.commit(list(range(100)), list(range(100)))


def test_load_then_grow_does_not_alias_the_bytes() -> None:
    c = _filled(4)
    blobs = kv.to_segments(c, 0, 4, FP, 1 << 20)
    d = kv.from_segments(blobs, FP, c.positions, c.tokens)
    d.append(torch.zeros(2, 3, 2, 4), torch.zeros(2, 3, 2, 4), [90, 91, 92], [1, 1, 1])
    assert_same_cache(c, kv.from_segments(blobs, FP, c.positions, c.tokens))
    assert d.positions[:4] == c.positions
