"""The decoding policy: which masked positions a step may decode (the window: set, prefix, ar, or
block's fixed blocks) and which of them it does decode (the set: confidence over tau, a prefix's
unbroken run, a guide's checked run).  Pure functions of the state, the parameters and the
step's predictions; knows nothing of the model's forward, the cache or sampling (model/decode.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from model.params import DecodeParams, DecodeState, Guide

GUIDE_TOP = 1024  # the most probable tokens a refused guided position tries, in order (setflow's vocabularies: all)


def active_positions(state: DecodeState, params: DecodeParams, mask_id: int) -> list[int]:
    """The masked positions this step may decode: a window of W positions from the leftmost
    mask (set, prefix, ar), or the fixed block that holds it (block)."""
    toks = state.tokens
    p0 = toks.index(mask_id, state.start)
    lo = p0 if params.policy != "block" else state.start + (p0 - state.start) // params.window * params.window
    hi = min(lo + params.window, len(toks))
    return [p for p in range(p0, hi) if toks[p] == mask_id]


def next_set(state: DecodeState, params: DecodeParams, active: list[int], logits: Tensor, tok: Tensor,
             conf: Tensor, mask_id: int) -> list[int]:
    """The masks this step decodes, as indices into `active` in position order (the commit
    order); tok, conf: (n_active,) the predicted tokens and their probabilities, held to
    params.guide in place when there is one; logits: (n_active, vocab), the masks' raw logits."""
    if params.guide is not None:
        guided(params.guide, state, active, logits, tok, conf, mask_id, params.tau)
    order = choose(tok, conf, params)
    if params.guide is not None:  # a token holds only with the tokens left of it: the chosen run from the leftmost
        n = next((k for k, j in enumerate(order) if j != k), len(order))
        order = list(range(max(n, 1)))
    return order


def choose(tok: Tensor, conf: Tensor, params: DecodeParams) -> list[int]:
    """Which active masks this step decodes, as indices into the active list (position order);
    tok, conf: (n_active,) their predicted tokens and probabilities.
    set / block / ar: the most confident mask plus every mask with confidence >= tau.
    prefix: the unbroken run of masks from the leftmost, in position order, whose every one
    clears tau and differs from its left neighbour; the leftmost alone when it does not clear
    tau.  The active list holds every mask of the window, so none is left open between two
    chosen ones (the tokens between them, if any, are decoded already or an infill template's
    context).  Two masks side by side do not see each other, so they are prone to both writing
    the token due at one of them ("USD" -> "USDD", "11799" -> "117999"): a repeat ends the run,
    and the repeated token is decided next step, knowing its neighbour."""
    if params.policy == "prefix":
        n = 1
        if params.tau is not None:
            ok, ids = (conf >= params.tau).tolist(), tok.tolist()  # one device sync each
            if ok[0]:
                while n < len(ok) and ok[n] and ids[n] != ids[n - 1]:
                    n += 1
        return list(range(n))
    chosen = {int(conf.argmax())}
    if params.tau is not None:
        chosen |= set((conf >= params.tau).nonzero().flatten().tolist())
    return sorted(chosen)


def guided(guide: Guide, state: DecodeState, active: list[int], logits: Tensor, tok: Tensor, conf: Tensor,
           mask_id: int, tau: float | None) -> None:
    """Hold a step's predictions to the guide, left to right (tok, conf: (n_active,), replaced
    in place): the tokens before an active position are the state's, with this step's predictions
    left of it.  A refused token becomes the most probable one the guide allows among the
    GUIDE_TOP most probable, with its probability (none allowed: the model's stays, and the tool
    says what is wrong).  A row's logits alone decide: the same bits batched or not.  The caller
    then commits only the chosen run from the leftmost mask, so that every token was checked
    against the tokens really before it (set and block would commit out of order: a token right
    of a mask that later opens a call would never be checked).

    Past the leftmost, a position joins that run only with a probability >= tau (every policy:
    the run is chosen, and a mask under tau is chosen only as the step's most confident, when
    none clears tau).  So the first position right of the leftmost under tau, as the guide leaves
    it, ends the guiding: the masks right of it are not committed this step whatever they hold.
    A refused one there looks for a stand-in only down to tau (none: its probability becomes 0,
    and it ends the run).  The committed tokens are those of guiding every position; a guide over
    long texts (workflows/narrative.py) is then asked about a handful of tokens a step, not
    about hundreds.  A MaskGuide (a grammar) holds each position to its whole mask instead
    (masked): under it a committed run is a prefix of a text the grammar can still complete."""
    mask = getattr(guide, "allowed", None)  # a MaskGuide's whole mask (a grammar's)
    if mask is not None:
        return masked(mask, state, active, logits, tok, conf, mask_id, tau)
    toks = state.tokens[state.start:active[-1]]  # a copy: this step's predictions are filled in
    ids = tok.tolist()
    for j, pos in enumerate(active):
        if j and tau is None:  # only the leftmost is committed
            break
        before = toks[:pos - state.start]
        if guide.allows(before, ids[j]) is False:
            row = logits[j].float().clone()
            row[mask_id] = -torch.inf
            probs = row.softmax(-1)
            top = probs.topk(min(GUIDE_TOP, probs.numel()))
            for p, t in zip(top.values.tolist(), top.indices.tolist()):
                if j and p < tau:  # no stand-in would be committed
                    conf[j] = 0.0
                    break
                if t != mask_id and guide.allows(before, t):
                    ids[j] = t
                    tok[j], conf[j] = t, probs[t]
                    break
        if j and float(conf[j]) < tau:  # type: ignore[operator]  # the run ends here
            break
        if pos - state.start < len(toks):
            toks[pos - state.start] = ids[j]


def masked(allowed: Callable[[list[int]], Any], state: DecodeState, active: list[int], logits: Tensor, tok: Tensor,
           conf: Tensor, mask_id: int, tau: float | None) -> None:
    """guided() under a MaskGuide (allowed: the tokens before -> its mask, numpy bool (vocab,);
    None: not guided), in place.  A token the mask forces (the only one it allows) is taken with
    probability 1: no other keeps the text completable, whatever the model thinks of it.  A
    refused token becomes the most probable token the mask allows, of the whole vocabulary, with
    its probability (past the leftmost only down to tau: below it the probability becomes 0, and
    the run ends there).  A mask that allows nothing (a grammar in error) leaves the model's
    token: the caller checks the document it ends with.  The run is held on host lists, read
    from tok and conf once and written back once where something changed; torch is asked only
    for a refused token's row softmax (the bits guided() takes), each further op on a CPU
    tensor's numpy view where it has one (a torch op's call costs more than its work here)."""
    toks = state.tokens[state.start:active[-1]]  # a copy: this step's predictions are filled in
    ids, ps = tok.tolist(), conf.tolist()  # (n_active,) each: one device sync each
    changed = False
    for j, pos in enumerate(active):
        if j and tau is None:  # only the leftmost is committed
            break
        a = allowed(toks[:pos - state.start])
        if a is not None:
            assert len(a) == logits.shape[-1], f"the guide's mask has {len(a)} ids, the logits {logits.shape[-1]}"
            n = int(np.count_nonzero(a))  # on the host, as the guide made it: no device op unless a token is refused
            if n == 1:
                ids[j], ps[j], changed = int(a.argmax()), 1.0, True
            elif n and not a[ids[j]]:
                t, p = _stand_in(logits[j], a, mask_id, conf.dtype)
                if j and p < tau:  # type: ignore[operator]  # no stand-in would be committed
                    ps[j] = 0.0
                else:
                    ids[j], ps[j] = t, p
                changed = True
        if j and ps[j] < tau:  # the run ends here
            break
        if pos - state.start < len(toks):
            toks[pos - state.start] = ids[j]
    if changed:
        for x, values in ((tok, ids), (conf, ps)):
            if (view := _host(x)) is not None:
                view[:] = values
            else:
                x.copy_(torch.tensor(values, dtype=x.dtype))


def _stand_in(logits: Tensor, a: Any, mask_id: int, dtype: torch.dtype) -> tuple[int, float]:
    """The most probable token of mask `a` (numpy bool (vocab,)) under one row's logits (vocab,),
    [MASK] left out, and its probability as a tensor of `dtype` holds it; the first of equals."""
    row = logits.float().clone()
    if (view := _host(row)) is not None:
        view[mask_id] = -np.inf  # a tensor's item set costs more than its softmax on a small vocabulary
    else:
        row[mask_id] = -torch.inf
    probs = row.softmax(-1)  # (vocab,)
    if (view := _host(probs)) is not None and dtype == torch.float32:
        t = int(np.where(a, view, np.float32(-1.0)).argmax())
        return t, float(view[t])
    best, at = torch.where(torch.from_numpy(a).to(probs.device), probs, -1.0).max(0)
    return int(at), float(best.to(dtype))


def _host(t: Tensor) -> Any:
    """A CPU tensor's numpy view (the same memory), where numpy holds its dtype; else None."""
    return t.numpy() if t.device.type == "cpu" and not t.requires_grad and t.dtype in (torch.float32, torch.int64) else None
