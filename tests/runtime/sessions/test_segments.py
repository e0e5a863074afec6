"""runtime/sessions/segments.py: the KV segment byte format (pure: no Redis)."""

from __future__ import annotations

import pytest

from runtime.errors import BadInput, CorruptState
from runtime.sessions.segments import HEADER, SegmentMeta, decode, encode, split

META = SegmentMeta("6cfff3ff2058a6b3", "float32", n_layers=2, n_kv_heads=2, head_dim=4, start=0, end=5)


def _payload(meta: SegmentMeta) -> bytes:
    return bytes(i % 251 for i in range((meta.end - meta.start) * meta.slot_bytes))


def test_round_trip() -> None:
    blob = encode(META, _payload(META))
    meta, payload = decode(blob, META.fingerprint)
    assert meta == META and bytes(payload) == _payload(META)
    assert META.slot_bytes == 2 * 2 * 2 * 4 * 4


def test_every_single_corrupted_byte_is_detected() -> None:
    blob = encode(META, _payload(META))
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x5A
        try:
            meta, payload = decode(bytes(bad), META.fingerprint)
        except CorruptState:
            continue
        pytest.fail(f"byte {i} corrupted and not detected")


def test_truncated_wrong_model_and_garbage_are_refused() -> None:
    blob = encode(META, _payload(META))
    for bad, match in ((blob[:-1], "length"), (blob[:10], "shorter than its header"),
                       (b"junk" + blob[4:], "magic")):
        with pytest.raises(CorruptState, match=match):
            decode(bad, META.fingerprint)
    with pytest.raises(CorruptState, match="of model 6cfff3ff2058a6b3, expected 0123"):
        decode(blob, "0123")


def test_split_keeps_every_segment_under_the_limit_and_covers_the_range() -> None:
    meta = META.with_slots(10, 110)
    payload = _payload(meta)
    limit = HEADER.size + 7 * meta.slot_bytes + 5  # room for 7 slots
    blobs = split(meta, payload, limit)
    assert all(len(b) <= limit for b in blobs) and len(blobs) == 15
    metas, parts = zip(*(decode(b, meta.fingerprint) for b in blobs))
    assert [(m.start, m.end) for m in metas][0] == (10, 17) and metas[-1].end == 110
    assert all(a.end == b.start for a, b in zip(metas, metas[1:]))
    assert b"".join(bytes(p) for p in parts) == payload


def test_bad_input_is_named() -> None:
    with pytest.raises(BadInput, match="payload of 3 bytes"):
        encode(META, b"abc")
    with pytest.raises(BadInput, match="dtype"):
        encode(SegmentMeta("x", "int8", 1, 1, 1, 0, 1), b"")
    with pytest.raises(BadInput, match="does not fit"):
        split(META, _payload(META), HEADER.size + 10)
