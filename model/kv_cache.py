"""KVCache: per-layer post-RoPE keys/values in slot (commit) order, with a ledger of the
(position, token id) of every slot.

Slots are appended in commit order and never reordered; positions are the tokens' true
positions (RoPE was applied with them), so the order of slots does not change attention scores.
Knows nothing about models, sessions or storage (its bytes in Redis are runtime/sessions/kv.py's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from model.attention import attention

if TYPE_CHECKING:
    from model.config import ModelConfig


@dataclass
class KVCache:
    k: Tensor  # (n_layers, capacity, n_kv_heads, head_dim) post-RoPE keys, slot order
    v: Tensor  # (n_layers, capacity, n_kv_heads, head_dim)
    pos: Tensor  # (capacity,) long: position id of each slot
    tok: Tensor  # (capacity,) long: token id of each slot
    length: int = 0  # slots [0, length) are valid
    rollbacks: int = 0  # rollbacks so far: a reader in another thread sees that slots it read may have changed

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

    def mask_shape(self, n: int) -> tuple[int, int]:
        """model.transformer.Keys: n queries over the valid slots, then the n."""
        return n, self.length + n

    def attend(self, i: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """model.transformer.Keys for one sequence: the n new k, v (1, n, Hkv, D) go to the
        scratch slots (committed only by commit()); q attends over the valid slots, then them."""
        assert k.shape[0] == 1 and mask is not None, "a KV cache serves one sequence (model/batch.py batches)"
        k_all, v_all = self.scratch(i, k[0], v[0])
        return attention(q, k_all[None], v_all[None], mask)

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
        self.rollbacks += 1  # before any slot is written again (runtime/sessions/writer.py reads it)
        self.length = slot

    crop = rollback  # same operation, named for its other use: keep the first n slots

    def fork(self, n: int | None = None) -> KVCache:
        """An independent copy of the first n slots (default: all)."""
        n = self.length if n is None else n
        assert 0 <= n <= self.length, f"fork at {n} outside [0, {self.length}]"
        cap = max(n, 1)
        return KVCache(self.k[:, :cap].clone(), self.v[:, :cap].clone(),
                       self.pos[:cap].clone(), self.tok[:cap].clone(), n)
