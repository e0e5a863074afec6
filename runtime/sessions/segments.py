"""KV segments: the byte format of one immutable chunk of a session's KV cache (bytes only, no
torch).  A segment holds the K/V of slots [start, end) in slot-major order — for each slot, for
each layer, K then V, each (n_kv_heads, head_dim) — behind a fixed header:

    magic "SFKV" | version u16 | dtype u8 | pad | fingerprint 16 bytes (ascii, zero-padded)
    | n_layers u32 | n_kv_heads u32 | head_dim u32 | start u32 | end u32 | crc32 u32 (of the
    header before it and the payload)

Slot-major order makes any slot range one contiguous byte range, so a long cache splits into
segments of at most Settings.segment_bytes without copying tensors around.  decode() checks
everything a reader must not trust: magic, version, length, checksum, fingerprint, shape.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from runtime.errors import BadInput, CorruptState

MAGIC = b"SFKV"
VERSION = 1
HEADER = struct.Struct("<4sHB1x16sIIIIII")
DTYPES = {"float32": (1, 4), "bfloat16": (2, 2), "float16": (3, 2)}  # name -> (code, itemsize)
_DTYPE_OF_CODE = {code: name for name, (code, _) in DTYPES.items()}


@dataclass(frozen=True)
class SegmentMeta:
    fingerprint: str  # the model's (checkpoint.fingerprint): K/V of another model are refused
    dtype: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    start: int  # first slot
    end: int  # one past the last slot

    @property
    def slot_bytes(self) -> int:
        """K and V of one slot across all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * DTYPES[self.dtype][1]

    def with_slots(self, start: int, end: int) -> SegmentMeta:
        return SegmentMeta(self.fingerprint, self.dtype, self.n_layers, self.n_kv_heads, self.head_dim, start, end)


def encode(meta: SegmentMeta, payload: bytes | memoryview) -> bytes:
    if meta.dtype not in DTYPES:
        raise BadInput(f"dtype must be one of {sorted(DTYPES)}, got {meta.dtype!r}")
    fp = meta.fingerprint.encode("ascii")
    if not 0 < len(fp) <= 16:
        raise BadInput(f"fingerprint must be 1..16 ascii characters, got {meta.fingerprint!r}")
    if not 0 <= meta.start < meta.end:
        raise BadInput(f"need 0 <= start < end, got [{meta.start}, {meta.end})")
    want = (meta.end - meta.start) * meta.slot_bytes
    if len(payload) != want:
        raise BadInput(f"payload of {len(payload)} bytes; slots [{meta.start}, {meta.end}) need {want}")
    head = HEADER.pack(MAGIC, VERSION, DTYPES[meta.dtype][0], fp, meta.n_layers, meta.n_kv_heads, meta.head_dim,
                       meta.start, meta.end, 0)[:-4]
    return head + struct.pack("<I", _crc(head, payload)) + bytes(payload)


def _crc(head: bytes | memoryview, payload: bytes | memoryview) -> int:
    """crc32 of the header (without its crc field) and the payload: any flipped byte shows."""
    return zlib.crc32(payload, zlib.crc32(head))


def header(head: bytes, fingerprint: str | None = None) -> SegmentMeta:
    """The meta of a segment from its first HEADER.size bytes (what a fork reads of the segments
    it shares: GETRANGE, not the K/V).  Raises CorruptState on a bad header or a mismatch; the
    length and checksum are decode()'s, which has the whole segment."""
    if len(head) < HEADER.size:
        raise CorruptState(f"segment of {len(head)} bytes is shorter than its header ({HEADER.size})")
    magic, version, code, fp, n_layers, n_kv, head_dim, start, end, _ = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise CorruptState(f"bad segment magic {magic!r}")
    if version != VERSION:
        raise CorruptState(f"segment format version {version}, this build reads {VERSION}")
    if code not in _DTYPE_OF_CODE:
        raise CorruptState(f"unknown dtype code {code}")
    meta = SegmentMeta(fp.rstrip(b"\0").decode("ascii", errors="replace"), _DTYPE_OF_CODE[code],
                       n_layers, n_kv, head_dim, start, end)
    if fingerprint is not None and meta.fingerprint != fingerprint:
        raise CorruptState(f"segment of model {meta.fingerprint}, expected {fingerprint}")
    if start >= end:
        raise CorruptState(f"segment of slots [{start}, {end})")
    return meta


def decode(blob: bytes, fingerprint: str | None = None) -> tuple[SegmentMeta, memoryview]:
    """-> (meta, payload view).  Raises CorruptState on any damage or mismatch."""
    meta = header(blob, fingerprint)
    start, end, crc = meta.start, meta.end, HEADER.unpack_from(blob)[-1]
    payload = memoryview(blob)[HEADER.size:]
    if len(payload) != (end - start) * meta.slot_bytes:
        raise CorruptState(f"segment length {len(payload)} does not match slots [{start}, {end})")
    if _crc(memoryview(blob)[:HEADER.size - 4], payload) != crc:
        raise CorruptState(f"segment checksum mismatch for slots [{start}, {end})")
    return meta, payload


def split(meta: SegmentMeta, payload: bytes | memoryview, max_bytes: int) -> list[bytes]:
    """The K/V of slots [meta.start, meta.end) as segments of at most max_bytes each."""
    per = (max_bytes - HEADER.size) // meta.slot_bytes
    if per < 1:
        raise BadInput(f"one slot ({meta.slot_bytes} bytes) does not fit a segment of {max_bytes} bytes")
    view = memoryview(payload)
    out = []
    for a in range(meta.start, meta.end, per):
        b = min(a + per, meta.end)
        lo, hi = (a - meta.start) * meta.slot_bytes, (b - meta.start) * meta.slot_bytes
        out.append(encode(meta.with_slots(a, b), view[lo:hi]))
    return out
