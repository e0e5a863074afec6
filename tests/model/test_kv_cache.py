"""KVCache: ledger bookkeeping, fork, and the checked byte format."""

import pytest
import torch

from model.kv_cache import KVCache, KVCacheFormatError

FP = "f" * 64


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


@pytest.mark.parametrize("n", [0, 1, 9])
def test_round_trip_is_exact_and_byte_identical(n: int) -> None:
    c = _filled(n) if n else KVCache.empty(2, 2, 4)
    blob = c.to_bytes(FP)
    d = KVCache.from_bytes(blob, FP)
    assert d.length == n and d.positions == c.positions and d.tokens == c.tokens
    assert torch.equal(d.k[:, :n], c.k[:, :n]) and torch.equal(d.v[:, :n], c.v[:, :n])
    assert d.to_bytes(FP) == blob


def test_bf16_codec_halves_the_payload_and_rounds_to_bf16() -> None:
    c = _filled(9)
    b32, b16 = c.to_bytes(FP, "fp32"), c.to_bytes(FP, "bf16")
    assert len(b16) < 0.6 * len(b32)
    d = KVCache.from_bytes(b16, FP)
    assert torch.equal(d.k[:, :9], c.k[:, :9].to(torch.bfloat16).float())
    assert KVCache.from_bytes(b16, FP).to_bytes(FP, "bf16") == b16


def test_every_single_byte_flip_is_detected() -> None:
    blob = _filled(4).to_bytes(FP)
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x5A
        with pytest.raises(KVCacheFormatError):
            KVCache.from_bytes(bytes(bad), FP)


def test_every_truncation_is_detected() -> None:
    blob = _filled(4).to_bytes(FP)
    for n in range(len(blob)):
        with pytest.raises(KVCacheFormatError):
            KVCache.from_bytes(blob[:n], FP)
    with pytest.raises(KVCacheFormatError):
        KVCache.from_bytes(blob + b"\0", FP)


def test_another_model_fingerprint_is_refused() -> None:
    blob = _filled(4).to_bytes(FP)
    with pytest.raises(KVCacheFormatError) as e:
        KVCache.from_bytes(blob, "0" * 64)
    assert e.value.code == "fingerprint"
    assert KVCache.from_bytes(blob, None).length == 4  # the check is the caller's choice


def test_unknown_codec_and_garbage_are_named_errors() -> None:
    with pytest.raises(ValueError):
        _filled(2).to_bytes(FP, "int3")
    with pytest.raises(KVCacheFormatError) as e:
        KVCache.from_bytes(b"not a cache at all, just bytes", FP)
    assert e.value.code == "magic"


def test_scratch_never_touches_valid_slots_and_commit_keeps_a_prefix() -> None:
    c = _filled(5)
    before = c.to_bytes(FP)
    c.reserve(3)
    new = torch.full((3, 2, 4), 7.0)
    k_all, v_all = c.scratch(1, new, -new)
    assert k_all.shape == (8, 2, 4) and torch.equal(k_all[5:], new) and torch.equal(v_all[5:], -new)
    assert c.to_bytes(FP) == before, "uncommitted scratch is invisible"
    for i in range(2):  # a forward writes every layer's scratch before committing
        c.scratch(i, new, -new)
    c.commit([50, 51], [1, 2])  # keep the first 2 of the 3 scratch slots
    assert c.length == 7 and c.positions[-2:] == [50, 51] and torch.equal(c.layer(0)[0][5:], new[:2])
    with pytest.raises(AssertionError):
        c.commit(list(range(100)), list(range(100)))


def test_load_then_grow_does_not_alias_the_blob() -> None:
    c = _filled(4)
    blob = c.to_bytes(FP)
    d = KVCache.from_bytes(blob, FP)
    d.append(torch.zeros(2, 3, 2, 4), torch.zeros(2, 3, 2, 4), [90, 91, 92], [1, 1, 1])
    assert KVCache.from_bytes(blob, FP).to_bytes(FP) == blob and d.positions[:4] == c.positions
