"""The paged KV pool: sessions' K/V in fixed-size blocks of one pool tensor, a block table per
session (nano-vllm's block manager: a free list, a ref count per block).  A session holds the
blocks its slots need, taken as it grows and given back when it leaves; a fork shares its
parent's blocks, and whichever of them writes a shared block first writes a copy (copy on
write).  Knows nothing of attention, batches or sessions' lifetimes (model/batch.py reads the
blocks; runtime/sessions/engine.py decides who leaves).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from model.config import ModelConfig
from model.kv_cache import KVCache

#: tokens per block.  16: the slack of a session's last block (at most 15 slots, and the few a
#: step writes past its length) stays under 10% of a 256-token session; model/batch.py gathers a
#: session's slots per layer, so a bigger block buys nothing there (bench/resume.py measures)
BLOCK = 16


class PoolExhausted(RuntimeError):
    """Every block is held, and nothing that holds one could give it back (model.pool.KVPool)."""


class Slots:
    """A cache's (n_layers, capacity, n_kv_heads, head_dim) tensor, as KVCache has it, read and
    written through its block table: view[layers, a:b] gathers slots [a, b) from the pool
    ((n_layers, b - a, H, D), or (b - a, H, D) for one layer: contiguous, the layout a KVCache
    slice has once copied), view[layers, a:b] = x scatters them.  Enough of a tensor for
    KVCache's own methods and its readers (runtime/sessions/kv.py)."""

    def __init__(self, data: Tensor, cache: PooledCache) -> None:
        self.data = data  # (n_layers, n_blocks * block_size, H, D): the pool's, flat over its slots
        self.cache = cache

    @property
    def shape(self) -> torch.Size:
        L, _, H, D = self.data.shape
        return torch.Size((L, self.cache.capacity, H, D))

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def element_size(self) -> int:
        return self.data.element_size()

    def _where(self, key: Any) -> tuple[int | slice, Tensor]:
        layers, slots = key
        assert isinstance(slots, slice) and slots.step is None, "a cache's slots are read as a range"
        return layers, self.cache.index[slots]  # (m,) the slots' places in the pool

    def __getitem__(self, key: Any) -> Tensor:
        layers, idx = self._where(key)
        if isinstance(layers, int):
            return self.data[layers].index_select(0, idx)  # (m, H, D)
        return self.data[layers].index_select(1, idx)  # (L', m, H, D)

    def __setitem__(self, key: Any, value: Tensor) -> None:
        layers, idx = self._where(key)
        value = value.to(device=self.data.device, dtype=self.dtype)  # a restore's bytes come from the CPU
        if isinstance(layers, int):
            self.data[layers].index_copy_(0, idx, value)
        else:
            self.data[layers].index_copy_(1, idx, value)


class PooledCache(KVCache):
    """A KVCache whose slots live in a KVPool's blocks: table[j] holds slots [j * B, (j + 1) * B).
    Its ledger (pos, tok) is its own (16 bytes a slot).  reserve() takes the blocks the next
    slots need, copying a shared one before it is written; fork() shares."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.table: list[int] = []
        self.index = torch.zeros(0, dtype=torch.long, device=pool.k.device)  # (capacity,) each slot's place
        self.live = True  # False once given back
        empty = torch.zeros(0, dtype=torch.long, device=pool.k.device)
        super().__init__(Slots(pool.flat_k, self), Slots(pool.flat_v, self), empty, empty.clone())  # type: ignore[arg-type]

    @property
    def capacity(self) -> int:
        return len(self.table) * self.pool.block_size

    @property
    def nbytes(self) -> int:
        """The pool memory it holds (its blocks, shared ones too)."""
        return len(self.table) * self.pool.block_bytes

    def reserve(self, n: int) -> None:
        """Room for n slots past the valid ones, each in a block of its own (copied if shared)."""
        need = self.length + n
        assert need <= self.pool.max_slots, f"a session holds {self.pool.max_slots} slots, {need} asked"
        if self.pool.writable(self.table, self.length, need):
            self._reindex()

    def _reindex(self) -> None:
        B = self.pool.block_size
        blocks = torch.tensor(self.table, dtype=torch.long, device=self.index.device)
        self.index = (blocks[:, None] * B + torch.arange(B, device=blocks.device)).flatten()  # (capacity,)
        if self.pos.numel() < self.capacity:  # the ledger follows (a new tensor: a reader keeps the old)
            grow = self.capacity - self.pos.numel()
            self.pos = torch.cat([self.pos, self.pos.new_zeros(grow)])
            self.tok = torch.cat([self.tok, self.tok.new_zeros(grow)])

    def trim(self) -> None:
        """Give back the blocks past the valid slots (scratch a last step wrote)."""
        keep = -(-self.length // self.pool.block_size)
        if keep < len(self.table):
            self.pool.release(self.table[keep:])
            del self.table[keep:]
            self._reindex()

    def fork(self, n: int | None = None) -> PooledCache:
        """The first n slots (default: all) as a new cache of the same pool, sharing their blocks."""
        n = self.length if n is None else n
        assert 0 <= n <= self.length, f"fork at {n} outside [0, {self.length}]"
        child = PooledCache(self.pool)
        child.table = self.pool.share(self.table[: -(-n // self.pool.block_size)])
        child._reindex()
        child.pos[:n], child.tok[:n] = self.pos[:n], self.tok[:n]
        child.length = n
        return child


class KVPool:
    """blocks blocks of block_size slots: k, v (n_layers, blocks, block_size, n_kv_heads,
    head_dim).  take() hands out an empty PooledCache (it holds nothing until it grows),
    give_back() takes its blocks back.  Thread-safe: a block is taken or freed under a lock.
    When a cache must grow and no block is free, reclaim() (its owner's: an idle session given
    back) is asked for one until it says it has none; then PoolExhausted."""

    def __init__(self, cfg: ModelConfig, blocks: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", block_size: int = BLOCK) -> None:
        shape = (cfg.n_layers, blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        # zeros, not empty: a padded attention (model/batch.py) reads blocks it masks out
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.flat_k = self.k.flatten(1, 2)  # (n_layers, blocks * block_size, H, D): views
        self.flat_v = self.v.flatten(1, 2)
        self.block_size = block_size
        self.max_slots = cfg.max_seq_len
        self.ref = [0] * blocks
        self.free: deque[int] = deque(range(blocks))
        self.reclaim: Callable[[], bool] = lambda: False
        self._lock = threading.Lock()

    @classmethod
    def of_bytes(cls, cfg: ModelConfig, nbytes: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", block_size: int = BLOCK, contexts: int = 0) -> KVPool:
        """As many blocks as nbytes holds, and at least `contexts` whole contexts' (each
        ceil(max_seq_len / block_size) blocks: the turns an engine admits at once)."""
        per = 2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8
        return cls(cfg, max(1, nbytes // per, contexts * -(-cfg.max_seq_len // block_size)), dtype, device, block_size)

    @property
    def blocks(self) -> int:
        return len(self.ref)

    @property
    def block_bytes(self) -> int:
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    @property
    def nbytes(self) -> int:
        return self.blocks * self.block_bytes

    @property
    def held(self) -> int:
        """Blocks held by some cache."""
        return self.blocks - len(self.free)

    def take(self) -> PooledCache:
        return PooledCache(self)

    def give_back(self, cache: PooledCache) -> None:
        assert cache.pool is self and cache.live, "a cache given back twice"
        self.release(cache.table)
        cache.table, cache.length, cache.live = [], 0, False
        cache._reindex()

    def share(self, table: list[int]) -> list[int]:
        with self._lock:
            for b in table:
                self.ref[b] += 1
        return list(table)

    def release(self, table: list[int]) -> None:
        with self._lock:
            for b in table:
                self.ref[b] -= 1
                if self.ref[b] == 0:
                    self.free.append(b)

    def writable(self, table: list[int], a: int, b: int) -> bool:
        """Make slots [a, b) of `table` writable by it alone: blocks taken for the slots past its
        end, a shared block copied (copy on write).  True if the table changed."""
        B = self.block_size
        first, last = a // B, -(-b // B)  # the blocks those slots touch
        while True:
            with self._lock:
                shared = [j for j in range(first, min(last, len(table))) if self.ref[table[j]] > 1]
                need = len(shared) + max(0, last - len(table))
                if need <= len(self.free):
                    for j in shared:  # copy on write: this table's own copy, the others keep theirs
                        new = self.free.popleft()
                        self.ref[new], self.ref[table[j]] = 1, self.ref[table[j]] - 1
                        self.k[:, new], self.v[:, new] = self.k[:, table[j]], self.v[:, table[j]]
                        table[j] = new
                    while len(table) < last:
                        new = self.free.popleft()
                        self.ref[new] = 1
                        table.append(new)
                    return need > 0
            if not self.reclaim():  # outside the lock: the owner gives a cache back through it
                raise PoolExhausted(f"the KV pool's {self.blocks} blocks of {B} tokens are all held by running "
                                    f"turns: {need} more needed, {len(self.free)} free")
