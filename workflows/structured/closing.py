"""The closing walk: the tokens that take a JSON grammar's matcher from its state to a closed
document soonest (a greedy walk), which the guide closes a document with within its budget
(guide.py JsonGuide._close).  Knows nothing of the budget or of torch."""

from __future__ import annotations

from typing import Any

import llguidance.numpy as lnp
import numpy as np

from workflows.structured.vocab import Vocab

WALK_LIMIT = 4096  # tokens of a closing walk that has not closed by then (it never will: walk)
FORCED_CACHED = 4096  # forced byte strings whose tokens a vocabulary keeps (a schema's names and punctuation)


def walk(m: Any, v: Vocab, eos: int, n_vocab: int, limit: int = WALK_LIMIT) -> tuple[list[int], bool, bytes | None]:
    """Tokens that take matcher `m` from its state to a closed document, the end of text last:
    a greedy walk (the grammar's forced bytes, tokenized: forced; else the first of v.closers
    it allows, else its lowest allowed one-byte token, else its lowest allowed id: lowest), `m` left
    where it was.  Longer than `limit` tokens (a walk that never closes): what it walked, cut
    there, without the end of text (one limit for every walk, whatever the budget: the walk
    from a state of another walk is the rest of it).  And whether `m` is inside a free string (one both brackets may go
    on: no pattern, no enum), which the walk's quote closes; and the walk's bytes (None where it
    took a token of several bytes by choice, not forced: then it is not one byte at a time).
    The tokens are the bytes tokenized as one (tokens): the same from any state of the walk."""
    took: list[int] = []
    free, exact = False, True
    while len(took) <= limit:
        if m.is_accepting():
            break
        step: list[int] | None = forced(m, v)
        if not step:
            ok = (t for t in v.closers if m.validate_tokens([t]))
            first = next(ok, None)
            if first == v.closers[0] and next(ok, None) == v.closers[1]:  # both brackets: inside a string
                first = next(ok, None)
                free = free or (not took and first == v.closers[2])  # its quote closes it
            step = None if first is None else [first]
        if step is None:
            first, one = lowest(m, v, n_vocab)
            exact = exact and one
            step = [first] if first is not None and first != eos else []
        n = m.try_consume_tokens(step) if step else 0
        if n == 0:
            break
        took.extend(step[:n])
    closed = m.is_accepting()
    m.rollback(len(took))
    spelt = b"".join(v.raw[t] for t in took)
    if len(took) > limit:
        return tokens(v, spelt), free, None
    path = tokens(v, spelt) if exact else took
    return path + [eos] * closed, free, spelt if exact else None


def lowest(m: Any, v: Vocab, n_vocab: int) -> tuple[int | None, bool]:
    """The lowest id of one byte matcher `m` allows, else its lowest allowed id (False: of
    several bytes); None: it allows nothing.  Read off the packed mask (the vocabulary's few
    one-byte ids, then its first non-zero byte), not unpacked: on a large vocabulary unpacking
    and scanning every id cost as much as the mask."""
    bits = lnp.allocate_token_bitmask(1, n_vocab)
    lnp.fill_next_token_bitmask(m, bits, 0)
    b8 = bits.view(np.uint8).reshape(-1)  # token i: bit i % 8 of byte i // 8
    ones = v.singles[(b8[v.singles >> 3] >> (v.singles & 7)) & 1 == 1]
    if len(ones):
        return int(ones[0]), True
    nz = np.flatnonzero(b8)
    if not len(nz):
        return None, False
    x = int(b8[nz[0]])
    t = int(nz[0]) * 8 + (x & -x).bit_length() - 1
    return (t, False) if t < n_vocab else (None, False)


def tokens(v: Vocab, b: bytes) -> list[int]:
    """Bytes as the vocabulary's tokens (llguidance's tokenizer), kept per byte string (forced)."""
    ids = v.forced.get(b)
    if ids is None:
        if len(v.forced) >= FORCED_CACHED:
            v.forced.clear()
        ids = v.forced[b] = list(v.lt.tokenize_bytes(b))
    return ids


def forced(m: Any, v: Vocab) -> list[int]:
    """The tokens of the bytes matcher `m` must take next (none: a choice is open), tokenized
    once per byte string: llguidance's forced tokens cost 15-30 us a step on a large vocabulary
    (they heal the last token), its forced bytes 2 us and a cached tokenization nothing."""
    b = m.compute_ff_bytes()
    return tokens(v, b) if b else []
