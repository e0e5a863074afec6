"""A KVCache's slots as store segments and back (the torch side of runtime/sessions/segments.py).

Payload layout, slot-major: (m, n_layers, 2, n_kv_heads, head_dim) — K then V of every layer
for each slot — so a slot range is one contiguous byte range.  Segments hold K/V only; the
(position, token) ledger of the slots travels in the manifest.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from model.kv_cache import KVCache
from runtime.errors import CorruptState
from runtime.sessions.segments import SegmentMeta, decode, split

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
                  device: torch.device | str = "cpu", headroom: int = 256, into: KVCache | None = None) -> KVCache:
    """The cache the segments hold, slots [0, n) in order, with the given ledger (and room for
    `headroom` more slots, so the next turn does not grow it).  Each segment's bytes are copied
    once, straight into the cache's layout: into `into` when given (an empty cache, a paged
    pool's: model/pool.py; no headroom), else a new one.  Raises CorruptState on any damaged,
    foreign or missing piece."""
    n = len(positions)
    if len(tokens) != n or not blobs:
        raise CorruptState(f"a ledger of {n} slots and {len(tokens)} tokens over {len(blobs)} segments")
    metas = [decode(b, fingerprint) for b in blobs]  # checks every segment before any copy
    first = metas[0][0]
    expect = 0
    for meta, _ in metas:
        if meta.start != expect or (meta.n_layers, meta.n_kv_heads, meta.head_dim, meta.dtype) != \
                (first.n_layers, first.n_kv_heads, first.head_dim, first.dtype):
            raise CorruptState(f"segment of slots [{meta.start}, {meta.end}) does not follow slot {expect}")
        expect = meta.end
    if expect != n:
        raise CorruptState(f"segments cover {expect} slots, the ledger has {n}")
    dtype = TORCH_DTYPES[first.dtype]
    if into is not None:
        if into.k.dtype != dtype or into.length:
            raise CorruptState(f"segments hold {dtype}, the cache {into.k.dtype} ({into.length} slots)")
        into.reserve(n)
        return _fill(into, metas, positions, tokens)
    # uninitialised, not zeros: every valid slot is overwritten below and scratch slots are
    # written before they are read (zeroing was half of a restore's time)
    shape = (first.n_layers, n + headroom, first.n_kv_heads, first.head_dim)
    cache = KVCache(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device),
                    torch.zeros(n + headroom, dtype=torch.long, device=device),
                    torch.zeros(n + headroom, dtype=torch.long, device=device))
    return _fill(cache, metas, positions, tokens)


def _fill(cache: KVCache, metas: list[tuple[SegmentMeta, memoryview]], positions: list[int], tokens: list[int]) -> KVCache:
    n = len(positions)
    dtype = cache.k.dtype
    for meta, payload in metas:
        with warnings.catch_warnings():  # a read-only view of the received bytes, only read from
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.frombuffer(payload, dtype=np.uint8))
        src = raw.view(dtype).view(meta.end - meta.start, meta.n_layers, 2, meta.n_kv_heads, meta.head_dim)
        cache.k[:, meta.start:meta.end] = src[:, :, 0].transpose(0, 1)  # (L, m, H, D)
        cache.v[:, meta.start:meta.end] = src[:, :, 1].transpose(0, 1)
    cache.pos[:n] = torch.tensor(positions, dtype=torch.long)
    cache.tok[:n] = torch.tensor(tokens, dtype=torch.long)
    cache.length = n
    return cache
