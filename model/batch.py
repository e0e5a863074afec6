"""Many sequences in one forward.  Their caches are PooledCaches of one paged KV pool
(model/pool.py: blocks and a block table per session); a BatchKV writes a batched forward's new
K/V into their blocks and gathers each one's keys from them; step_batch runs one forward over B
sequences, each with its own positions, window, pending set, stop state and committed K/V, then
chooses each one's next set exactly as step() does (model/decode.py: the same plan and advance).
The linear layers run on the sequences' tokens packed into one row; on a CPU every row attends
as the sequence's call alone would have it (model/attend.c: all sequences in one call that reads
their slots in place, each row's arithmetic that of its own call; nothing padded), so it decodes
the same tokens alone or in any batch, in bf16 too; on a GPU the steps
attend in one padded call over their gathered blocks (padding masked), the same to float
tolerance (tests/model/test_batch.py).  Knows nothing of sessions or threads.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

import torch
from torch import Tensor

from model import rowdot
from model.attention import additive, attention, heads
from model.decode import StepEvent, StepPlan, advance, documents, greedy, plan, step
from model.masks import step_mask
from model.params import DecodeParams, DecodeState
from model.pool import PooledCache
from model.transformer import SetDLM

#: devices where each sequence of a batch attends in a call of its own: the call a batch-1
#: forward makes, so the same bits in any batch (in bf16 too), and batched attention does not pay
#: on a CPU (one sequence's K/V are read once per step whatever the batch: one SDPA call of 16
#: sequences x 12 queries over 600 keys took 0.99 ms here, 16 calls of one 1.10 ms; padding the
#: keys to the longest row costs more).  Elsewhere (a GPU: a call per sequence and layer would
#: make the forward launch-bound) the steps attend in one padded call, each long input alone.
ALONE_ON = ("cpu",)
#: in that padded call, a sequence with more new tokens than this (a turn's input) attends alone:
#: the steps' queries padded to its length would cost that many each
LONG = 32


@dataclass
class _Group:
    """Sequences whose queries attend in one padded call: their tokens' places in the packed
    row, their block tables padded to one width, and their additive mask (B_g, T_g, S_g) over
    the first S_g slots those tables hold."""

    tokens: Tensor  # into the packed row
    unpack: tuple[Tensor, Tensor]  # each of those tokens' (b, t) in (B_g, T_g)
    tables: Tensor  # (B_g, ceil(S_g / block_size)) their blocks, padded with block 0 (masked out)
    S: int
    mask: Tensor


class BatchKV:
    """model.transformer.Keys for one forward over B pooled caches, its tokens packed: sequence
    b's n_b new tokens are tokens [o_b, o_b + n_b) of one row of N = sum(n_b) (the linear layers
    run on all N at once).  Sequence b has C_b cached slots; attend() writes its new K/V to its
    scratch slots [C_b, C_b + n_b) (their places in its blocks), then, on a device of ALONE_ON,
    each sequence attends over its first C_b + n_b slots under its own step mask, as a batch-1
    forward does (model/kv_cache.py KVCache.attend over model/pool.py Slots): where
    model/attend.c serves, all of them in one call reading the slots in place (each row the
    bits of its own call), else a call each over its slots gathered.
    Elsewhere the steps (n_b <= LONG) attend in one call, unpacked into (B_g, T_g = max n_b)
    queries over their block tables' first max(C_b + n_b) slots (padding masked out:
    batch_mask), and each long input alone in a group of one.  The masks are each sequence's
    step mask, narrowed to its documents (model/masks.py)."""

    def __init__(self, caches: Sequence[PooledCache], ids: Tensor, pos: Tensor, counts: Sequence[int],
                 pending: Sequence[int], bos_id: int | None, dtype: torch.dtype) -> None:
        """ids, pos: (N,) the packed tokens; counts, pending: each sequence's new tokens and how
        many of them (first) are its clean pending set."""
        pool = caches[0].pool
        assert all(c.pool is pool and c.live for c in caches), "one pool's caches"
        for c, n in zip(caches, counts):
            c.reserve(n)  # blocks for the scratch slots, a shared one copied (model/pool.py)
        dev = pool.k.device
        self.pool = pool
        self.dst = torch.cat([c.index[c.length:c.length + n] for c, n in zip(caches, counts)])  # (N,) into the pool
        # alone: per sequence its tokens in the packed row and its additive mask (1, 1, n_b, S_b):
        # the one model/decode.py builds for it alone; and all their slots' places in the pool,
        # sequence after sequence (sum S_b,): one gather a layer, split into each one's keys
        self.seqs: list[tuple[slice, Tensor]] = []
        self.sizes: list[int] = []
        slots: list[Tensor] = []
        self.groups: list[_Group] = []
        if dev.type not in ALONE_ON:
            self._group(caches, ids, pos, counts, pending, bos_id, dtype)
            return
        o = 0
        for c, n, m, several in zip(caches, counts, pending, _several_documents(caches, ids, pos, counts, bos_id)):
            C, new = c.length, slice(o, o + n)
            if several:  # narrowed to each query's document (model/masks.py)
                mask = additive(documents(step_mask(C, m, n - m, dev), c, ids[new], pos[new], bos_id)[None, None],
                                dtype, dev)
            else:  # one document: the cache in full, then the new tokens' step block
                mask = torch.zeros((1, 1, n, C + n), dtype=dtype, device=dev)
                mask[0, 0, :, C:] = _step_block(m, n, dtype, dev)
            self.seqs.append((new, mask))
            slots.append(c.index[: C + n])
            self.sizes.append(C + n)
            o += n
        self.gather = torch.cat(slots)
        self.counts = list(counts)
        self.masks = torch.cat([m.flatten() for _, m in self.seqs])  # each one's (n_b, S_b), flat

    def _group(self, caches: Sequence[PooledCache], ids: Tensor, pos: Tensor, counts: Sequence[int],
               pending: Sequence[int], bos_id: int | None, dtype: torch.dtype) -> None:
        """The padded groups: the steps together, each long input alone."""
        dev, B = self.pool.k.device, self.pool.block_size
        offsets = [0, *accumulate(counts)]
        steps = [b for b, n in enumerate(counts) if n <= LONG]
        for part in ([steps] if steps else []) + [[b] for b, n in enumerate(counts) if n > LONG]:
            cs = [caches[b] for b in part]
            S = max(c.length + counts[b] for b, c in zip(part, cs))
            mask = batch_mask([c.length for c in cs], [pending[b] for b in part], [counts[b] for b in part], S, dev)
            for j, (b, c) in enumerate(zip(part, cs)):  # no query reads an earlier document
                C, n, o = c.length, counts[b], offsets[b]
                mask[j, :n, : C + n] = documents(mask[j, :n, : C + n], c, ids[o:o + n], pos[o:o + n], bos_id)
            width = -(-S // B)
            tables = [c.table[:width] + [0] * (width - len(c.table[:width])) for c in cs]
            self.groups.append(_Group(
                torch.tensor([offsets[b] + t for b in part for t in range(counts[b])], device=dev),
                (torch.tensor([j for j, b in enumerate(part) for _ in range(counts[b])], device=dev),
                 torch.tensor([t for b in part for t in range(counts[b])], device=dev)),
                torch.tensor(tables, device=dev), S, additive(mask, dtype, dev)))

    def reserve(self, n: int) -> None:
        pass  # the caches reserved at construction

    def mask_shape(self, n: int) -> None:
        return None  # the masks are this object's

    def attend(self, i: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """q (1, N, H, D), k, v (1, N, Hkv, D) packed -> (1, N, H * D)."""
        assert mask is None, "a batch holds its own masks"
        fk, fv = self.pool.flat_k[i], self.pool.flat_v[i]  # (blocks * block_size, Hkv, D)
        fk.index_copy_(0, self.dst, k[0])
        fv.index_copy_(0, self.dst, v[0])
        if self.groups:
            out = q.new_empty((q.shape[1], q.shape[2] * q.shape[3]))  # (N, H * D)
            bk, bv = self.pool.k[i], self.pool.v[i]  # (blocks, block_size, Hkv, D)
            for g in self.groups:
                keys, values = (t[g.tables].flatten(1, 2)[:, : g.S] for t in (bk, bv))  # (B_g, S_g, Hkv, D)
                qs = q.new_zeros((len(keys), g.mask.shape[1], *q.shape[2:]))  # (B_g, T_g, H, D), zeros at padding
                qs[g.unpack] = q[0, g.tokens]
                out[g.tokens] = attention(qs, keys, values, g.mask)[g.unpack]
            return out[None]
        if rowdot.attends(q, fk, fv, self.masks):  # every sequence in one call, its slots read in place
            return rowdot.attend_ragged(q[0], fk, fv, self.gather, self.counts, self.sizes, self.masks,
                                        torch.get_num_threads()).reshape(1, q.shape[1], -1)
        qh = q.transpose(1, 2)  # (1, H, N, D)
        out = torch.empty_like(qh)
        # every sequence's keys in one gather, each one's (S_b, Hkv, D) then contiguous, as the
        # gather of model/pool.py Slots makes them for a batch-1 forward: the same values and strides
        ks, vs = (f.index_select(0, self.gather).split(self.sizes) for f in (fk, fv))
        for (new, m), keys, values in zip(self.seqs, ks, vs):
            out[:, :, new] = heads(qh[:, :, new], keys[None].transpose(1, 2), values[None].transpose(1, 2), m)  # (1, Hkv, S_b, D)
        return out.transpose(1, 2).reshape(1, q.shape[1], -1)


def batch_mask(cached: Sequence[int], pending: Sequence[int], new: Sequence[int], S: int,
               device: torch.device | str = "cpu") -> Tensor:
    """The step mask (model/masks.py step_mask) of B sequences at once: (B, T, S) over each
    row's keys [cached C_b | new n_b | padding], T = max n_b.  Pending query j sees the cache and
    pending 0..j; a mask query sees the cache, every pending token and itself.  A padding query
    (t >= n_b) sees key 0 only, so its softmax stays finite; its output is never read."""
    C = torch.tensor(cached, device=device)[:, None, None]  # (B, 1, 1)
    m = torch.tensor(pending, device=device)[:, None, None]
    n = torch.tensor(new, device=device)[:, None, None]
    t = torch.arange(max(new), device=device)[None, :, None]  # (1, T, 1) query index
    s = torch.arange(S, device=device)[None, None, :]  # (1, 1, S) key slot
    rel = s - C  # the key's index among the new tokens (negative: a cached slot)
    is_pending = t < m
    sees_new = (rel >= 0) & ((is_pending & (rel <= t)) | (~is_pending & ((rel < m) | (rel == t))))
    real = t < n
    return (real & ((s < C) | sees_new)) | (~real & (s == 0))


def _step_block(m: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The additive step mask of n new tokens, m of them pending, over themselves: (n, n), the
    last n columns of step_mask(C, m, n - m) whatever C.  A step's (n <= 64: a few kB each) is
    cached and only ever read; an input's, as long as max_commit, is built each time."""
    return (_cached_block if n <= 64 else _block)(m, n, dtype, device)


def _block(m: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return additive(step_mask(0, m, n - m, device), dtype, device)


_cached_block = lru_cache(maxsize=1024)(_block)


def _several_documents(caches: Sequence[PooledCache], ids: Tensor, pos: Tensor, counts: Sequence[int],
                       bos_id: int | None) -> list[bool]:
    """Per sequence: do its keys (its cache, then its new tokens) hold a document start past
    position 0, so that its mask must be narrowed (model/masks.py within_documents)?  Asked for
    all at once (their ledgers end to end).  On another device than the CPU the answer would
    cost a sync: there every mask is narrowed (a no-op for one document)."""
    if bos_id is None:
        return [False] * len(caches)
    if caches[0].pool.k.device.type != "cpu":
        return [True] * len(caches)
    several = [False] * len(caches)
    for flat, lengths in ((torch.cat([c.tok[: c.length] for c in caches]), [c.length for c in caches]),
                          (ids, counts)):  # the cached slots, then the packed new tokens
        at = torch.cat([c.pos[: c.length] for c in caches]) if flat is not ids else pos
        ends = list(accumulate(lengths))
        for t in ((flat == bos_id) & (at > 0)).nonzero().flatten().tolist():
            several[bisect_right(ends, t)] = True
    return several


@torch.no_grad()
def batched_forward(model: SetDLM, caches: Sequence[PooledCache], ids: Sequence[list[int]],
                    pos: Sequence[list[int]], n_masks: Sequence[int]) -> Tensor:
    """ONE forward over B sequences' [pending (clean) | masks]: commits each one's pending K/V and
    returns their masks' logits (sum n_masks_b, vocab), sequence by sequence: each one's rows are
    what fused_forward returns for it alone (on a GPU, to float tolerance)."""
    dev = caches[0].k.device
    counts = [len(x) for x in ids]
    pending = [c - n for c, n in zip(counts, n_masks)]
    ids_t = torch.tensor([t for x in ids for t in x], device=dev)  # (N,): the sequences packed
    pos_t = torch.tensor([p for x in pos for p in x], device=dev)
    kv = BatchKV(caches, ids_t, pos_t, counts, pending, model.cfg.doc_start_id, caches[0].k.dtype)
    offsets = [sum(counts[:b]) for b in range(len(counts))]
    masks = torch.tensor([o + j for o, m, c in zip(offsets, pending, counts) for j in range(m, c)], dtype=torch.long,
                         device=dev)  # the rows whose logits are read: every sequence's masks
    logits, _ = model(ids_t[None], pos_t[None], None, kv, logits_at=masks)  # (1, sum n_masks, vocab)
    for b, c in enumerate(caches):
        m = pending[b]
        c.commit(pos[b][:m], ids[b][:m])  # their K/V are in its first m scratch slots
    return logits[0]


def step_batch(model: SetDLM, seqs: Sequence[tuple[PooledCache, DecodeState, DecodeParams]],
               commits: Sequence[tuple[PooledCache, list[int], list[int]]] = ()) -> list[StepEvent | Exception]:
    """One forward for B sequences (each open: not state.done): commit each one's pending set,
    score its active masks, choose its next set.  Each sequence's StepEvent is what step()
    would have returned for it alone.  commits: other caches' clean tokens (ids, positions) to
    commit in the same forward, causally, as prefill would (a turn's input, a turn's last set).
    A failure of the forward raises, before any state changed; a failure of one sequence's
    choice after it (a rollback's prefill, say) is that sequence's alone: its exception stands
    in its place in the list, and the others' steps stand."""
    if len(seqs) == 1 and not commits:  # one sequence: the batch-1 forward (no packing)
        cache, state, params = seqs[0]
        try:
            return [step(model, cache, state, params)]
        except Exception as e:  # noqa: BLE001 - this sequence's alone, as below
            return [e]
    mask_id = model.cfg.mask_id
    assert all(p.use_cache for _, _, p in seqs), "batched steps read the cache (use_cache=False is batch 1)"
    plans: list[StepPlan] = [plan(model, s, p) for _, s, p in seqs]
    n_masks = [len(pl.active) for pl in plans]
    logits = batched_forward(model, [c for c, _, _ in seqs] + [c for c, _, _ in commits],
                             [pl.ids(s, mask_id) for pl, (_, s, _) in zip(plans, seqs)] + [ids for _, ids, _ in commits],
                             [pl.positions for pl in plans] + [pos for _, _, pos in commits],
                             n_masks + [0] * len(commits))  # (sum n_masks, vocab)
    # the greedy sequences' tokens and probabilities in one go (the same bits as one by one); an
    # infill never predicts a special id at its holes (decode.never): it predicts its own
    predicted: list[tuple[Tensor, Tensor] | None] = [None] * len(seqs)
    if any(p.temperature == 0 and not s.infill for _, s, p in seqs):
        try:  # the forward has committed: a failure here is not the forward's (each then predicts its own)
            tok, conf = greedy(logits, mask_id)
            predicted = [(t, cf) if p.temperature == 0 and not s.infill else None
                         for t, cf, (_, s, p) in zip(tok.split(n_masks), conf.split(n_masks), seqs)]
        except Exception:  # noqa: BLE001, S110 - each sequence's advance predicts in its own try below
            pass
    out: list[StepEvent | Exception] = []
    for pl, (c, s, p), lg, pr in zip(plans, seqs, logits.split(n_masks), predicted):
        try:
            out.append(advance(model, c, s, p, pl, lg, pr))
        except Exception as e:  # noqa: BLE001 - see above
            out.append(e)
    return out
