"""Set decoding as small pure functions: prefill, step, decode (a generator of StepEvents),
commit_pending, begin_turn, begin_infill_turn, begin_infill, truncate.  Which positions a step
decodes is the policy's (model/policy.py); here the forwards, the predictions and the stops.

A session's decoding state is a plain DecodeState (token per position, MASK where undecoded;
the pending set; the RNG) that serialises to JSON beside the KVCache bytes.  Every function
takes the model, the cache and the state as arguments; only the cache and the state are
mutated.  Timing, logging and progress stay in the caller.

Positions are never re-based and masks are never compacted: a turn ends at a fully decoded
prefix, and tokens decoded past a stop are rolled back out of the cache.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from model.config import ModelConfig
from model.kv_cache import KVCache
from model.masks import step_mask, within_documents
from model.params import DecodeError, DecodeParams, DecodeState
from model.policy import active_positions, next_set
from model.transformer import SetDLM


@dataclass
class StepEvent:
    """What one step did, in decode order (not position order).  When a stop fires, `cut` says
    where the text ends: positions >= cut that earlier events reported are dropped (rolled back),
    so a streaming client erases them; the final text is always state.tokens."""

    step: int  # index of this step in the region
    committed: list[int]  # positions whose K/V entered the cache in this forward
    positions: list[int]  # positions decoded in this step (the new pending set), below any cut
    tokens: list[int]  # their token ids
    nfe: int  # forward passes so far
    done: bool  # the region is finished (all decoded, or a stop fired)
    logits: Tensor | None = None  # (n_active, vocab) raw logits of the active masks
    cut: int | None = None  # a stop fired: the sequence now ends at this position
    length: int = 0  # the cache's valid slots after this step (a reader behind the decoder reads no further)
    rollbacks: int = 0  # the cache's rollback count after this step (a reader behind sees if one came since)


# ---- forwards ----------------------------------------------------------------------------


@torch.no_grad()
def prefill(model: SetDLM, cache: KVCache, ids: list[int], pos: list[int]) -> int:
    """Causal forward of clean tokens (in the order given) against the cache; commits them all.
    Returns the number of forwards it ran (0 when there is nothing to commit, else 1)."""
    if not ids:
        return 0
    dev = cache.k.device
    ids_t, pos_t = torch.tensor(ids, device=dev), torch.tensor(pos, device=dev)
    mask = documents(step_mask(cache.length, len(ids), 0, dev), cache, ids_t, pos_t, model.cfg.doc_start_id)
    model(ids_t, pos_t, mask, cache, logits_at=slice(0, 0))  # K/V only: no logits are read
    cache.commit(pos, ids)
    return 1


def documents(mask: Tensor, cache: KVCache, ids_t: Tensor, pos_t: Tensor, bos_id: int | None) -> Tensor:
    """mask: (T, C + T) over [the cache's C slots | T new tokens ids_t at pos_t], narrowed so
    that no query reads an earlier document (model/masks.py within_documents)."""
    C = cache.length
    return within_documents(mask, torch.cat([cache.pos[:C], pos_t]), torch.cat([cache.tok[:C], ids_t]), pos_t, bos_id)


@torch.no_grad()
def fused_forward(model: SetDLM, cache: KVCache, ids: list[int], pos: list[int], n_masks: int,
                  use_cache: bool = True) -> Tensor:
    """ONE forward over [pending (clean) | masks]: commits the pending K/V, returns the masks'
    logits (n_masks, vocab).  use_cache=False recomputes every committed token from the ledger
    instead of reading cached K/V (same result, the baseline's cost)."""
    dev = cache.k.device
    m = len(ids) - n_masks
    if use_cache:  # pending first in the input, so its K/V are the first m scratch slots
        ids_t, pos_t = torch.tensor(ids, device=dev), torch.tensor(pos, device=dev)
        mask = documents(step_mask(cache.length, m, n_masks, dev), cache, ids_t, pos_t, model.cfg.doc_start_id)
        logits, _ = model(ids_t, pos_t, mask, cache, logits_at=slice(m, None))
        cache.commit(pos[:m], ids[:m])
        return logits[0]
    C = cache.length
    ids_t = torch.cat([cache.tok[:C], torch.tensor(ids, device=dev)])
    pos_t = torch.cat([cache.pos[:C], torch.tensor(pos, device=dev)])
    mask = within_documents(step_mask(0, C + m, n_masks, dev), pos_t, ids_t, pos_t, model.cfg.doc_start_id)
    logits, kv = model(ids_t, pos_t, mask, return_kv=True, logits_at=slice(C + m, None))
    assert kv is not None
    cache.append(kv.k[:, 0, C:C + m], kv.v[:, 0, C:C + m], pos[:m], ids[:m])
    return logits[0]


#: commits clean tokens (ids, positions) to a cache in one causal forward; returns the forwards
#: it ran: prefill itself, or a batcher's, which runs it in the next batched forward
Commit = Callable[[KVCache, list[int], list[int]], int]


def commit_pending(model: SetDLM, cache: KVCache, state: DecodeState, commit: Commit | None = None) -> None:
    """Eagerly commit the pending set with one mask-free forward (same K/V as the fused step)."""
    run = commit or partial(prefill, model)
    state.nfe += run(cache, [state.tokens[p] for p in state.pending], state.pending)
    state.pending = []


# ---- opening a region --------------------------------------------------------------------


def begin_turn(model: SetDLM, cache: KVCache, state: DecodeState | None, ids: list[int],
               params: DecodeParams, commit: Commit | None = None) -> DecodeState:
    """Append `ids` (prompt, user or tool text) at the next positions by one causal prefill
    (fusing in any pending set first), then open params.max_new_tokens masks after them.
    Refuses (DecodeError "context_overflow") before touching anything when the model's context
    would be exceeded: the cache and the ledger never outgrow max_seq_len.  The session RNG is
    seeded from params.seed once, on the first sampled turn, and then carried in the state.
    commit: who runs the prefill (default: prefill, here)."""
    mask_id = model.cfg.mask_id
    state = _open_region(model, cache, state, list(ids), [mask_id] * params.max_new_tokens, params, commit)
    state.start, state.done = len(state.tokens) - params.max_new_tokens, params.max_new_tokens == 0
    return state


def begin_infill_turn(model: SetDLM, cache: KVCache, state: DecodeState | None, tokens: list[int],
                      params: DecodeParams | None = None) -> DecodeState:
    """Append `tokens` at the next positions, as begin_turn does (fusing in any pending set
    first), but as an infill region: `tokens` holds mask_id at the holes.  Its context (the
    tokens left and right of the holes) is prefilled causally in positional order, in the same
    forward as the pending set; the holes are then decoded in place (no stop criteria, no
    masks past the input: params.max_new_tokens is not used).  The commit order (pending,
    context, then the holes as they are decided) is the turn's ledger, so one causal prefill of
    it rebuilds the same K/V.  Refuses (DecodeError) before touching anything: "state" while a
    region is open, "context_overflow" past the model's context, "params" without a hole or
    with an id outside the vocabulary.  params: only seeds the session RNG when sampling (once,
    as begin_turn does)."""
    n0 = len(state.tokens) if state is not None else 0
    state = _open_region(model, cache, state, list(tokens), [], params, infill=True)
    state.start, state.done = state.tokens.index(model.cfg.mask_id, n0), False  # the first hole
    return state


def _open_region(model: SetDLM, cache: KVCache, state: DecodeState | None, ids: list[int], masks: list[int],
                 params: DecodeParams | None, commit: Commit | None = None, infill: bool = False) -> DecodeState:
    """The region opener of begin_turn and begin_infill_turn: checks everything before touching
    anything (a region still open, the context, the ids), then commits the pending set and the
    input's clean ids (an infill's context: its ids but the holes, in positional order) in one
    causal prefill, and appends ids + masks to the state's tokens.  The caller sets the region's
    start and done.  Seeds the session RNG from params.seed on the first sampled turn."""
    cfg, kind = model.cfg, "infill" if infill else "turn"
    state = state if state is not None else DecodeState(tokens=[])
    if not state.done:
        raise DecodeError("state", "the previous region is still being decoded")
    n0 = len(state.tokens)
    end = n0 + len(ids) + len(masks)
    if end > cfg.max_seq_len:
        raise DecodeError("context_overflow", f"{kind} needs positions up to {end}, the model's context is {cfg.max_seq_len}")
    if not cfg.valid_ids(ids, holes=infill):
        raise DecodeError("params", "infill ids must be token ids inside the vocabulary (mask_id at the holes)" if infill
                          else "input ids must be real token ids inside the vocabulary")
    if infill and cfg.mask_id not in ids:
        raise DecodeError("params", "infill needs at least one masked position")
    ctx = [i for i, t in enumerate(ids) if t != cfg.mask_id]  # offsets of the clean ids (all of a turn's)
    clean = [state.tokens[p] for p in state.pending] + [ids[i] for i in ctx]
    state.nfe += (commit or partial(prefill, model))(cache, clean, state.pending + [n0 + i for i in ctx])
    state.pending, state.infill, state.step = [], infill, 0
    state.tokens = state.tokens + ids + masks
    if params is not None and params.temperature > 0 and state.rng is None:
        state.rng = _rng_dump(torch.Generator().manual_seed(params.seed))
    return state


def begin_infill(model: SetDLM, cache: KVCache, tokens: list[int],
                 params: DecodeParams | None = None) -> DecodeState:
    """Open an infill region over a fresh sequence: `tokens` holds mask_id at the holes.  All
    context (left and right of the holes) is prefilled causally in positional order.  The case
    of begin_infill_turn with no session yet; the cache must be empty."""
    if cache.length:
        raise DecodeError("state", "infill opens a fresh session: the cache must be empty")
    return begin_infill_turn(model, cache, None, tokens, params)


# ---- the loop ----------------------------------------------------------------------------


@dataclass
class StepPlan:
    """One sequence's part of a forward: its pending set (clean, committed by the forward) and
    its active masks (scored), as the input [pending | masks]."""

    committed: list[int]  # the pending set's positions, commit order
    active: list[int]  # the masks scored this step, position order

    def ids(self, state: DecodeState, mask_id: int) -> list[int]:
        return [state.tokens[p] for p in self.committed] + [mask_id] * len(self.active)

    @property
    def positions(self) -> list[int]:
        return self.committed + self.active


def plan(model: SetDLM, state: DecodeState, params: DecodeParams) -> StepPlan:
    """Step 1): the pending set (this forward commits it) and the active window (policy.py)."""
    assert not state.done, "step() on a finished region"
    return StepPlan(state.pending, active_positions(state, params, model.cfg.mask_id))


def advance(model: SetDLM, cache: KVCache, state: DecodeState, params: DecodeParams, p: StepPlan,
            logits: Tensor, predicted: tuple[Tensor, Tensor] | None = None) -> StepEvent:
    """Step 3) after the forward (the pending set committed; logits (n_active, vocab) of
    p.active): predict the masks' tokens, choose the next set (policy.py), then stop at EOS / a
    stop sequence inside the fully decoded prefix, or when nothing is masked.  predicted:
    greedy(logits) when the caller has it already (a batch's, taken for all its greedy
    sequences at once: model/batch.py)."""
    state.nfe += 1
    tok, conf = predicted if predicted is not None else _predict(logits, model.cfg, params, state)
    order = next_set(state, params, p.active, logits, tok, conf, model.cfg.mask_id)  # indices into active, commit order
    state.pending = [p.active[j] for j in order]
    for j, t in zip(order, tok[order].tolist()):  # one device sync for the whole set
        state.tokens[p.active[j]] = t
    state.step += 1
    cut = _maybe_stop(model, cache, state, params)
    return StepEvent(state.step - 1, p.committed, list(state.pending), [state.tokens[q] for q in state.pending],
                     state.nfe, state.done, logits, cut, cache.length, cache.rollbacks)


def step(model: SetDLM, cache: KVCache, state: DecodeState, params: DecodeParams) -> StepEvent:
    """One forward: commit the pending set, score the active masks, choose the next set
    (model/batch.py step_batch runs the same plan and advance around one forward for many)."""
    # 1) pick the active window
    p = plan(model, state, params)
    # 2) one forward: commit the pending set, score the masks
    logits = fused_forward(model, cache, p.ids(state, model.cfg.mask_id), p.positions, len(p.active), params.use_cache)
    # 3) choose the next set (and stop at EOS or a stop sequence)
    return advance(model, cache, state, params, p, logits)


def decode(model: SetDLM, cache: KVCache, state: DecodeState, params: DecodeParams) -> Iterator[StepEvent]:
    """Step until the region is done; yields one StepEvent per forward.  The last set stays
    pending in the state (commit it with commit_pending, or let the next turn fuse it)."""
    while not state.done:
        yield step(model, cache, state, params)


@torch.no_grad()
def generate(model: SetDLM, prompt: list[int], params: DecodeParams,
             cache: KVCache | None = None) -> tuple[list[int], KVCache, DecodeState]:
    """Convenience: prompt -> generated ids (through EOS when it stopped there).  A cache it
    makes holds the whole turn from the start (a step's pending set and masks included), so no
    step copies it to grow."""
    w = next(model.parameters())
    if cache is None:
        room = len(prompt) + params.max_new_tokens + 2 * params.window
        cache = KVCache.for_model(model.cfg, capacity=room, dtype=w.dtype, device=w.device)
    state = begin_turn(model, cache, None, prompt, params)
    for _ in decode(model, cache, state, params):
        pass
    return state.tokens[len(prompt):], cache, state


# ---- helpers -----------------------------------------------------------------------------


def never(cfg: ModelConfig, state: DecodeState) -> int | list[int]:
    """The ids a step never predicts: [MASK]; at an infill's holes every special id too (a hole
    is a token of the text: an [EOS] or [BOS] there would end or split its document)."""
    return sorted(cfg.special_ids) if state.infill else cfg.mask_id


def _predict(logits: Tensor, cfg: ModelConfig, params: DecodeParams, state: DecodeState) -> tuple[Tensor, Tensor]:
    """logits: (n, vocab) -> token (n,) and its probability (n,), never one of never()."""
    if params.temperature == 0:
        return greedy(logits, never(cfg, state))
    logits = logits.float().clone()
    logits[:, never(cfg, state)] = -torch.inf
    assert state.rng is not None, "sampling needs the session RNG (begin_turn seeds it)"
    gen = _rng_load(state.rng)
    probs = (logits / params.temperature).softmax(-1).cpu()
    tok = torch.multinomial(probs, 1, generator=gen).flatten()
    state.rng = _rng_dump(gen)
    return tok, probs.gather(1, tok[:, None]).flatten()


def greedy(logits: Tensor, never: int | list[int]) -> tuple[Tensor, Tensor]:
    """logits: (n, vocab) -> the most probable token (n,) but the `never` id(s) ([MASK]), and its
    probability (n,).  Row by row: a row gives the same bits among n rows as alone (softmax and
    max reduce over the vocabulary only), so one call may serve many sequences' rows."""
    logits = logits.float().clone()
    logits[:, never] = -torch.inf
    conf, tok = logits.softmax(-1).max(-1)
    return tok, conf


def _maybe_stop(model: SetDLM, cache: KVCache, state: DecodeState, params: DecodeParams) -> int | None:
    """Checked every step (the reference checks every W steps, on a prefix that may still hold
    masks, then compacts them); stopping as soon as the decoded prefix holds the stop saves
    forwards and gives the same text as decoding on and cutting there."""
    cfg, toks = model.cfg, state.tokens
    try:
        p0 = toks.index(cfg.mask_id, state.start)
    except ValueError:
        p0 = len(toks)
    eos = None if params.ignore_eos else cfg.eos_id
    cut = None if state.infill else _stop_cut(toks, state.start, p0, eos, params.stop)
    if cut is not None:
        truncate(model, cache, state, cut)
    state.done = cut is not None or p0 == len(toks)
    return cut


def _stop_cut(toks: list[int], start: int, end: int, eos: int | None, stops: list[list[int]]) -> int | None:
    """The position just after the first EOS or stop sequence inside toks[start:end]."""
    best = None
    if eos is not None and eos in toks[start:end]:
        best = toks.index(eos, start, end) + 1
    for s in stops:
        n = len(s)
        for p in range(start, end - n + 1):
            if toks[p:p + n] == s:
                best = p + n if best is None else min(best, p + n)
                break
    return best


def truncate(model: SetDLM, cache: KVCache, state: DecodeState, cut: int) -> None:
    """Drop every position >= cut from the state and the cache.  Slots committed after the first
    dropped slot were computed while seeing it, so the cache rolls back to that slot and the
    valid later slots are committed again in their order (one forward): the result is exactly
    the cache of a run that never decoded past the cut.  Tokens below the cut keep their values
    even if they were chosen while a dropped token was visible: a decoded token is final (no
    remasking), as in the reference decoder; only their K/V are recomputed."""
    state.tokens = state.tokens[:cut]
    state.pending = [p for p in state.pending if p < cut]
    positions = cache.positions
    bad = next((i for i, p in enumerate(positions) if p >= cut), None)
    if bad is None:
        return
    keep = [(p, t) for p, t in zip(positions[bad:], cache.tokens[bad:]) if p < cut]
    cache.rollback(bad)
    state.nfe += prefill(model, cache, [t for _, t in keep], [p for p, _ in keep])


def _rng_dump(gen: torch.Generator) -> str:
    return base64.b64encode(gen.get_state().numpy().tobytes()).decode()


def _rng_load(text: str) -> torch.Generator:
    gen = torch.Generator()
    gen.set_state(torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8))
    return gen
