"""A KVCache's slots as store segments and back (the torch side of runtime/segments.py).

Payload layout, slot-major: (m, n_layers, 2, n_kv_heads, head_dim) — K then V of every layer
for each slot — so a slot range is one contiguous byte range.  Segments hold K/V only; the
(position, token) ledger of the slots travels in the manifest.
"""

from __future__ import annotations

import torch

from model.kv_cache import KVCache
from runtime.segments import SegmentMeta, decode, split
from runtime.errors import CorruptState

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


def to_segments(cache: KVCache, start: int, end: int, fingerprint: str, max_bytes: int) -> list[bytes]:
    """Slots [start, end) of the cache as segments of at most max_bytes."""
    L, _, H, D = cache.k.shape
    kv = torch.stack([cache.k[:, start:end], cache.v[:, start:end]], dim=2)  # (L, m, 2, H, D)
    kv = kv.permute(1, 0, 2, 3, 4).contiguous().cpu()  # (m, L, 2, H, D): slot-major
    payload = kv.view(torch.uint8).numpy().tobytes()
    meta = SegmentMeta(fingerprint, DTYPE_NAMES[cache.k.dtype], L, H, D, start, end)
    return split(meta, payload, max_bytes)


def from_segments(blobs: list[bytes], fingerprint: str, positions: list[int], tokens: list[int],
                  device: torch.device | str = "cpu") -> KVCache:
    """The cache the segments hold, slots [0, n) in order, with the given ledger.  Raises
    CorruptState on any damaged, foreign or missing piece."""
    parts = []
    expect = 0
    meta = None
    for blob in blobs:
        meta, payload = decode(blob, fingerprint)
        if meta.start != expect:
            raise CorruptState(f"segments out of order: slot {meta.start}, expected {expect}")
        expect = meta.end
        dtype = TORCH_DTYPES[meta.dtype]
        flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype)
        parts.append(flat.view(meta.end - meta.start, meta.n_layers, 2, meta.n_kv_heads, meta.head_dim))
    if meta is None or expect != len(positions) or len(tokens) != len(positions):
        raise CorruptState(f"segments cover {expect} slots, the ledger has {len(positions)}")
    kv = torch.cat(parts).permute(1, 0, 2, 3, 4).to(device)  # (L, n, 2, H, D)
    n = len(positions)
    return KVCache(kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous(),
                   torch.tensor(positions, dtype=torch.long, device=device),
                   torch.tensor(tokens, dtype=torch.long, device=device), n)
