"""JsonGuide: a turn's next-token masks under a JSON Schema's grammar (model.params MaskGuide),
the document closed within the turn's budget.  Knows nothing of the model's forward or of
torch; a mask is a numpy array."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import llguidance.numpy as lnp
import numpy as np

from domain.formats import STRING_CAP, Format, grammar
from model.tokenizer import Tokenizer
from workflows.structured import closing, grammars
from workflows.structured.lengths import Lengths

NUMBER_CAP = 16  # tokens of a number's characters in a row, where the grammar allows another token (JsonGuide)
ESCAPE = 6  # what a token may add to the closing tokens besides the values it opens: an escape's \uXXXX, "n" -> "ull"
MASKS_KEPT = 16  # masks a guide keeps, by the length of the tokens before (a step's positions, the next step's first)


class JsonGuide:
    """A turn's guide to a JSON Schema (model.params MaskGuide): before each position, the
    grammar's mask of the tokens that may follow what is before it; after the end of text (EOS),
    no guidance (the turn has ended there).  A pure function of the tokens before: one matcher
    follows them, rolled back to where a new `before` leaves the last one and fed the rest.  The
    last MASKS_KEPT masks are kept by the length of their `before` while the matcher's tokens
    still begin with it: a step asks the position its last step's run stopped at again as its
    first, and gets it without moving the matcher.  A mask handed out is shared: read it, never
    write it.  `mask_s` keeps each computed mask's time (the benchmark's).

    With a `budget` (the turn's token limit), the document closes within it whatever the model
    writes: from where its closing tokens (closing.walk) come within the grammar's slack of the
    positions left, the mask is the next closing token alone (_close).  Its grammar then leaves a
    free string uncapped (grammars.uncapped): the cap's grammar (a string's characters counted to
    STRING_CAP) made the mask several times dearer on a large vocabulary.  The guide caps it
    instead (_capped): from STRING_CAP characters on, the mask is the string's quote alone.  On
    a large vocabulary (grammars.HELD_VOCAB) it leaves the client's maxLength out too, and a
    matcher of the grammar that counts it, beside this one, holds it (grammars.held, lengths.py).
    Without a budget the grammar's cap and bounds hold (domain/formats.py bounded)."""

    def __init__(self, tok: Tokenizer, n_vocab: int, eos_id: int, fmt: Format, budget: int | None = None) -> None:
        self._eos, self._n, self._budget = eos_id, n_vocab, budget
        if budget is None:
            self._m, self._v, self._cost, start = grammars.matcher(tok, n_vocab, eos_id, fmt.schema, grammar(fmt.schema))
            self._lengths: Lengths | None = None
        else:  # the client's maxLengths held by the guide where it can (held), not counted by the grammar
            self._lengths = grammars.held(tok, n_vocab, eos_id, fmt.schema)
            g = grammars.uncapped(fmt.schema, counted=self._lengths is None)
            self._m, self._v, self._cost, start = grammars.matcher(tok, n_vocab, eos_id, fmt.schema, g)
        self._slack = self._v.openers * self._cost + ESCAPE  # what one token may add to the closing tokens
        self._ids: list[int] = []  # what the matcher has consumed
        self._masks: dict[int, np.ndarray[Any, np.dtype[np.bool_]]] = {}  # k -> the mask after ids[:k]
        self._bits = lnp.allocate_token_bitmask(1, n_vocab)  # (1, n_vocab / 32) int32, C-contiguous
        self._ptr, self._bytes = self._bits.ctypes.data, self._bits.nbytes
        self._bytes_view = self._bits.view(np.uint8)  # (1, n_vocab / 8), its bits unpacked into each mask
        #: (at, the closing tokens from ids[:at] (None: not tokenized yet), whether ids[:at] ends
        #: inside a free string: its quote first, then what follows it whatever quiet tokens the
        #: string goes on with, the closing bytes the tokens spell (None where the walk took a
        #: choice of several bytes) and whether they close the document: the end of text last)
        self._plan: tuple[int, list[int] | None, bool, bytes | None, bool] | None = (0, *start, start[0][-1:] == [eos_id])
        self._rise: list[tuple[int, bool]] = [(0, True)]  # _close's sums over the plan's tokens since
        self.mask_s: list[float] = []  # each computed mask's time, its closing walk's (walk_s) included
        self.walk_s: list[float] = []  # each computed mask's closing-walk part (_close)
        self.broken = 0  # closing walks longer than their bound said (the benchmark checks: 0)

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        a = self.allowed(before)
        return None if a is None else bool(a[token])

    def allowed(self, before: Sequence[int]) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
        if self._eos in before:
            return None
        k = len(before)
        kept = self._masks.get(k)
        if kept is not None and self._ids[:k] == (before if isinstance(before, list) else list(before)):
            return kept
        if not self._follow(before):
            return None  # a token the grammar refuses is before: nothing holds (document() says so)
        t0 = time.perf_counter()
        filled: list[np.ndarray[Any, np.dtype[np.bool_]]] = []

        def grammars_mask() -> np.ndarray[Any, np.dtype[np.bool_]]:
            if not filled:
                filled.append(self._fill(before))
            return filled[0]

        close = self._close(k, grammars_mask)
        self.walk_s.append(time.perf_counter() - t0)
        if close is None and self._budget is not None:
            close = self._capped(before)
        if close is not None:
            mask = np.zeros(self._n, dtype=np.bool_)
            mask[close] = True
        else:
            mask = grammars_mask()
        self._masks[k] = mask
        if len(self._masks) > MASKS_KEPT:
            del self._masks[min(self._masks)]
        self.mask_s.append(time.perf_counter() - t0)
        return mask

    def _fill(self, before: Sequence[int]) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """The grammar's mask after `before` (the matcher's tokens), a number past NUMBER_CAP
        tokens ended and the client's lengths held."""
        self._m.unsafe_compute_mask_ptr(self._ptr, self._bytes)  # lnp.fill_next_token_bitmask, unchecked
        mask = np.unpackbits(self._bytes_view, count=self._n, bitorder="little").view(np.bool_)
        num = self._v.numeric
        if before and num[before[-1]] and len(before) >= NUMBER_CAP and all(num[t] for t in before[-NUMBER_CAP:]):
            if (mask & ~num).any():  # a number ends (a small model repeats its 0s)
                mask &= ~num
        if self._lengths is not None:
            self._lengths.hold(self._m, mask)
        return mask

    def _slack_of(self, mask: np.ndarray[Any, np.dtype[np.bool_]]) -> int:
        """What one token `mask` allows may add to the closing tokens: the most openers of those
        it allows (vocab.py Vocab.openings, the fewest ids first looked at) times the grammar's
        cost, plus ESCAPE; at most the guide's slack (the vocabulary's most openers)."""
        for n, ids in self._v.openings:
            if mask[ids].any():
                return n * self._cost + ESCAPE
        return ESCAPE

    def _capped(self, before: Sequence[int]) -> int | None:
        """The quote, where `before` ends inside a free string of STRING_CAP characters or more
        (counted from the last token with a quote: a partial character's token counts as one);
        None: any token the grammar allows may come.  Free: the grammar allows the quote and takes
        a letter more for every position of the budget (a string the client bounded stops it)."""
        v = self._v
        if v.quote is None or v.letter is None or not before or v.quoted[before[-1]]:
            return None
        chars, k = 0, len(before) - 1
        while k >= 0 and not v.quoted[before[k]] and chars < STRING_CAP:
            chars, k = chars + v.chars[before[k]], k - 1
        if k < 0 or chars + v.tail[before[k]] < STRING_CAP:
            return None
        m, n = self._m, self._budget or 0
        counted = m if self._lengths is None else self._lengths.m  # the client's bounds counted
        if not m.validate_tokens([v.quote]) or counted.validate_tokens([v.letter] * n) < n:
            return None
        return v.quote

    def _close(self, at: int, mask: Callable[[], np.ndarray[Any, np.dtype[np.bool_]]]) -> int | None:
        """The token that must come next for the document to close within the budget (the first
        of its closing tokens, closing.walk); None: any token the grammar allows may come.  It must
        once the closing tokens are within the slack of the positions left: what one token the
        grammar allows here (mask(): its mask, computed only where the vocabulary's slack leaves
        it open) may add to them (_slack_of; grammars.cost).  The closing walk is redone only
        where a bound on its length says it may be that close: the last walk's length, plus for
        each token since that is not the walk's own what it may add (its OPENERS' count times the
        grammar's cost, plus ESCAPE).
        Inside a free string (no pattern, no enum) a token of no quote and no backslash leaves
        the walk as it was: a quote, then the same.  Tokens whose bytes begin the walk's bytes
        leave the rest of them (a walk of one byte at a time, the same from any of its states):
        the closing tokens are those bytes tokenized again, without a walk, and only where they
        may be that close (a byte each, at most).  Whatever the path here, the answer is the
        walk's from these tokens: its first token, or None where it is shorter than the positions
        left by more than the slack (each shortcut on an upper bound of its length)."""
        if self._budget is None:
            return None
        left = self._budget - at  # positions left, this one and the end of text's included
        bound, slack = sys.maxsize, self._slack
        if self._plan is not None:
            at0, path, free, walk, closed = self._plan
            n = at - at0
            rise = self._rise  # rise[i]: what ids[at0:at0 + i] may add, and whether each stays in a string
            for t in self._ids[at0 + len(rise) - 1:at]:
                r, stays = rise[-1]
                rise.append((r + self._v.opens[t] * self._cost + ESCAPE, stays and self._v.stays[t]))
            bound = (len(path) if path is not None else len(walk or b"") + closed) + rise[n][0]
            if bound + slack < left:  # far from the end: no walk is that close, whatever token follows
                return None
            slack = self._slack_of(mask())
            if bound + slack < left:  # nor whatever token the grammar allows here
                return None
            if free and rise[n][1]:  # still inside the string: the same walk, from here
                self._plan, self._rise, n = (at, path, free, walk, closed), [(0, True)], 0
            elif n and walk is not None:
                done = b"".join(self._v.raw[t] for t in self._ids[at0:at])
                if walk.startswith(done):  # the walk's own bytes: the rest of it
                    walk, path = walk[len(done):], None
                    self._plan, self._rise, n = (at, path, False, walk, closed), [(0, True)], 0
            if n == 0:
                if path is None:
                    assert walk is not None
                    if len(walk) + closed + slack < left:  # no more tokens than bytes
                        return None
                    path = closing.tokens(self._v, walk) + [self._eos] * closed
                    self._plan = (at, path, self._plan[2], walk, closed)
                return None if len(path) + slack < left else path[0]
        else:
            slack = self._slack_of(mask())
        path, free, walk = closing.walk(self._m, self._v, self._eos, self._n)
        if len(path) > bound:
            self.broken += 1
        self._plan, self._rise = (at, path, free, walk, path[-1:] == [self._eos]), [(0, True)]
        return path[0] if len(path) + slack >= left else None

    def _follow(self, before: Sequence[int]) -> bool:
        """Bring the matcher to `before`; False where it refuses one of its tokens.  The masks
        kept past where `before` leaves its tokens go."""
        ids, n = self._ids, min(len(before), len(self._ids))
        k = n if list(before[:n]) == (ids if n == len(ids) else ids[:n]) else next(i for i in range(n) if before[i] != ids[i])
        if k == len(ids) == len(before):
            return True
        if k < len(ids):
            self._m.rollback(len(ids) - k)
            if self._lengths is not None:
                self._lengths.m.rollback(len(ids) - k)
            del ids[k:]
            for gone in [j for j in self._masks if j > k]:
                del self._masks[gone]
            if self._plan is not None and self._plan[0] > k:
                self._plan = None
            elif self._plan is not None:
                del self._rise[k - self._plan[0] + 1:]
        rest = list(before[k:])
        if rest:
            took = int(self._m.try_consume_tokens(rest))
            if self._lengths is not None and took:
                counted = int(self._lengths.m.try_consume_tokens(rest[:took]))
                if counted < took:  # a token past a client's bound (never one of this guide's masks)
                    self._m.rollback(took - counted)
                    took = counted
            ids.extend(rest[:took])
            return took == len(rest)
        return True
