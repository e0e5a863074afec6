"""KVCache: per-layer post-RoPE keys/values in slot (commit) order, with a ledger of the
(position, token id) of every slot, and a checked byte format.

Slots are appended in commit order and never reordered; positions are the tokens' true
positions (RoPE was applied with them), so the order of slots does not change attention scores.
Knows nothing about models, sessions or storage.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from model.config import ModelConfig

MAGIC = b"SFKV"
FORMAT_VERSION = 1
# header = MAGIC | version u16 | json length u32 ; then json, payload, crc32 u32 of all before it
_PREFIX = struct.Struct("<4sHI")
_CRC = struct.Struct("<I")
CODECS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class KVCacheFormatError(ValueError):
    """A serialised cache is damaged, truncated, of another format, or of another model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code  #: stable machine-readable reason, e.g. "checksum", "fingerprint"


@dataclass
class KVCache:
    k: Tensor  # (n_layers, capacity, n_kv_heads, head_dim) post-RoPE keys, slot order
    v: Tensor  # (n_layers, capacity, n_kv_heads, head_dim)
    pos: Tensor  # (capacity,) long: position id of each slot
    tok: Tensor  # (capacity,) long: token id of each slot
    length: int = 0  # slots [0, length) are valid

    @classmethod
    def empty(cls, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int = 64,
              dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> KVCache:
        shape = (n_layers, capacity, n_kv_heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(capacity, dtype=torch.long, device=device),
                   torch.zeros(capacity, dtype=torch.long, device=device))

    @classmethod
    def for_model(cls, cfg: ModelConfig, capacity: int = 64, dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu") -> KVCache:
        return cls.empty(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, capacity, dtype, device)

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    @property
    def positions(self) -> list[int]:
        return self.pos[: self.length].tolist()

    @property
    def tokens(self) -> list[int]:
        return self.tok[: self.length].tolist()

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Valid K, V of layer i: each (length, n_kv_heads, head_dim), views, no copy."""
        return self.k[i, : self.length], self.v[i, : self.length]

    def reserve(self, n: int) -> None:
        """Room for n more slots past the valid ones (grows by doubling: amortised O(1))."""
        need = self.length + n
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity)
        grow = cap - self.capacity
        pad = lambda t: torch.cat([t, t.new_zeros((t.shape[0], grow) + t.shape[2:])], dim=1)  # noqa: E731
        self.k, self.v = pad(self.k), pad(self.v)
        self.pos = torch.cat([self.pos, self.pos.new_zeros(grow)])
        self.tok = torch.cat([self.tok, self.tok.new_zeros(grow)])

    def append(self, k: Tensor, v: Tensor, pos: list[int] | Tensor, tok: list[int] | Tensor) -> None:
        """Commit m slots.  k, v: (n_layers, m, n_kv_heads, head_dim); pos, tok: (m,)."""
        m = k.shape[1]
        assert v.shape == k.shape and k.shape[0] == self.k.shape[0] and k.shape[2:] == self.k.shape[2:], \
            f"kv shape {tuple(k.shape)} does not fit cache {tuple(self.k.shape)}"
        assert len(pos) == m and len(tok) == m, "ledger and K/V disagree on the number of slots"
        if m == 0:
            return
        self.reserve(m)
        a, b = self.length, self.length + m
        self.k[:, a:b] = k
        self.v[:, a:b] = v
        self.commit(pos, tok)

    def scratch(self, i: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write T not-yet-committed K/V of layer i right after the valid slots (room must be
        reserved) and return layer i's K, V over [0, length + T): each (length + T, Hkv, D),
        views, no copy of the cached slots.  k, v: (T, n_kv_heads, head_dim)."""
        a, b = self.length, self.length + k.shape[0]
        assert b <= self.capacity, "reserve() scratch room before writing it"
        self.k[i, a:b] = k
        self.v[i, a:b] = v
        return self.k[i, :b], self.v[i, :b]

    def commit(self, pos: list[int] | Tensor, tok: list[int] | Tensor) -> None:
        """Keep the first m scratch slots (written by the last forward) as committed slots."""
        m = len(pos)
        assert len(tok) == m and self.length + m <= self.capacity, "commit beyond the scratch slots"
        a, b = self.length, self.length + m
        self.pos[a:b] = torch.as_tensor(pos, dtype=torch.long)
        self.tok[a:b] = torch.as_tensor(tok, dtype=torch.long)
        self.length = b

    def rollback(self, slot: int) -> None:
        """Forget slots [slot, length): the cache becomes what it was before they were committed."""
        assert 0 <= slot <= self.length, f"rollback to {slot} outside [0, {self.length}]"
        self.length = slot

    crop = rollback  # same operation, named for its other use: keep the first n slots

    def fork(self, n: int | None = None) -> KVCache:
        """An independent copy of the first n slots (default: all)."""
        n = self.length if n is None else n
        assert 0 <= n <= self.length, f"fork at {n} outside [0, {self.length}]"
        cap = max(n, 1)
        return KVCache(self.k[:, :cap].clone(), self.v[:, :cap].clone(),
                       self.pos[:cap].clone(), self.tok[:cap].clone(), n)

    # ---- bytes -------------------------------------------------------------------------

    def to_bytes(self, fingerprint: str, codec: str = "fp32") -> bytes:
        """Serialise slots [0, length): header (magic, version, json meta), ledger, K, V, crc32."""
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r}; known: {sorted(CODECS)}")
        n = self.length
        meta = {"fingerprint": fingerprint, "codec": codec, "n_slots": n,
                "n_layers": self.k.shape[0], "n_kv_heads": self.k.shape[2], "head_dim": self.k.shape[3]}
        head = json.dumps(meta, sort_keys=True).encode()
        dt = CODECS[codec]
        parts = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)), head,
                 _raw(self.pos[:n].to(torch.int32)), _raw(self.tok[:n].to(torch.int32)),
                 _raw(self.k[:, :n].to(dt)), _raw(self.v[:, :n].to(dt))]
        body = b"".join(parts)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, blob: bytes, fingerprint: str | None = None, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> KVCache:
        """Inverse of to_bytes.  Raises KVCacheFormatError on any damage or mismatch; never
        returns a wrong cache.  fingerprint: the loading model's; None skips that check."""
        try:
            return cls._parse(memoryview(blob), fingerprint, dtype, device)
        except KVCacheFormatError:
            raise
        except Exception as e:  # any other parse failure is damage too
            raise KVCacheFormatError("corrupt", f"cannot parse cache blob: {e}") from e

    @classmethod
    def _parse(cls, blob: memoryview, fingerprint: str | None, dtype: torch.dtype,
               device: torch.device | str) -> KVCache:
        if len(blob) < _PREFIX.size + _CRC.size:
            raise KVCacheFormatError("truncated", f"blob of {len(blob)} bytes is shorter than a header")
        magic, version, hlen = _PREFIX.unpack_from(blob)
        if bytes(magic) != MAGIC:
            raise KVCacheFormatError("magic", f"not a setflow KV blob (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise KVCacheFormatError("version", f"format version {version}, this build reads {FORMAT_VERSION}")
        (crc,) = _CRC.unpack_from(blob, len(blob) - _CRC.size)
        if zlib.crc32(blob[: -_CRC.size]) != crc:  # memoryview slices: no copy
            raise KVCacheFormatError("checksum", "crc32 mismatch: the blob is damaged or truncated")
        off = _PREFIX.size
        meta = json.loads(bytes(blob[off: off + hlen]))
        off += hlen
        if fingerprint is not None and meta["fingerprint"] != fingerprint:
            raise KVCacheFormatError("fingerprint", f"cache of model {meta['fingerprint'][:12]}, "
                                                    f"loading model is {fingerprint[:12]}")
        n, L, H, D = meta["n_slots"], meta["n_layers"], meta["n_kv_heads"], meta["head_dim"]
        dt = CODECS[meta["codec"]]
        end = len(blob) - _CRC.size
        sizes = [(torch.int32, (n,)), (torch.int32, (n,)), (dt, (L, n, H, D)), (dt, (L, n, H, D))]
        need = sum(math.prod(shape) * torch.empty((), dtype=t).element_size() for t, shape in sizes)
        if off + need != end:
            raise KVCacheFormatError("length", f"payload of {end - off} bytes, the header says {need}")
        # one copy of the payload into a writable buffer (torch.frombuffer wants one); the tensors
        # below are views of it, converted only where dtype or device differ
        buf = bytearray(blob[off:end])
        parts = []
        at = 0
        for t, shape in sizes:
            count = math.prod(shape)
            parts.append(torch.frombuffer(buf, dtype=t, count=count, offset=at).reshape(shape) if count
                         else torch.empty(shape, dtype=t))
            at += count * torch.empty((), dtype=t).element_size()
        pos, tok, k, v = parts
        if n == 0:  # keep one slot of room, as empty() does
            return cls.empty(L, H, D, 1, dtype, device)
        return cls(k.to(device, dtype), v.to(device, dtype), pos.to(device, torch.long),
                   tok.to(device, torch.long), n)



def _raw(t: Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
