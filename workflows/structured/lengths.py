"""A JSON string's maxLength held by the guide rather than by the grammar (guide.py
JsonGuide, with a budget).  A grammar that counts a string's characters (llguidance: maxLength 40,
12) makes every mask inside that string several times dearer on a large vocabulary (Qwen3's:
about 1.3 ms against 0.1-0.2).  So the guide's grammar leaves such a string uncounted, and a
second matcher of the counting grammar follows the same tokens (consuming a token is cheap; only
its mask is dear) and is asked two things a mask:

- how many characters the string it is in may still take: the letters it accepts (`room`); a
  token fits when its characters before its first quote (`head`, escapes counted as llguidance
  counts them or more) are no more;
- for the few tokens that open a string and write more into it than the schema's shortest bound
  (`seg`), whether it takes them at all.

A token that ends inside an escape (an odd run of backslashes) or inside a character (its
UTF-8 bytes cut: a rare character a vocabulary spells in bytes) is never allowed (`cut`): the
next token's quote would be the string's and not its end, which `head` does not read, and no
letter could be asked after it.  Every token
allowed is one the counting grammar accepts; it follows them, so it would refuse one that is not
(JsonGuide._follow: nothing holds).  Knows nothing of torch; masks are numpy arrays."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

LETTER = "a"  # a character every string takes that counts one (llguidance's count: 1, as `\n` and é)


@dataclass(frozen=True)
class Spans:
    """What the lengths read of a vocabulary's ids (each token's bytes as the grammar engine has
    them, decoded with replacement: a partial character counts one, at least what it is)."""

    head: np.ndarray[Any, np.dtype[np.uint8]]  # (n_vocab,) characters before the first quote (all: none; 255 at most)
    seg: np.ndarray[Any, np.dtype[np.int32]]  # (n_vocab,) the most characters after a quote, before the next
    whole: np.ndarray[Any, np.dtype[np.bool_]]  # (n_vocab,) ends inside no escape and no character (not cut)
    longest: int  # the largest head
    letter: int | None  # the id of LETTER


def _spans_of(raw: bytes) -> tuple[int, int, bool]:
    """(head, seg, cut) of one token's bytes: an escape counts one character, a \\uXXXX six
    (llguidance counts it as more than one), a cut character one."""
    text = raw.decode("utf-8", "replace")
    head, seg, run, quoted, i = 0, 0, 0, False, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            head, seg = (head, max(seg, run)) if quoted else (run, seg)
            quoted, run, i = True, 0, i + 1
        elif c == "\\":
            six = text[i + 1:i + 2] == "u"
            run, i = run + (6 if six else 1), i + (6 if six else 2)
        else:
            run, i = run + 1, i + 1
    head, seg = (head, max(seg, run)) if quoted else (run, seg)
    return head, seg, (len(text) - len(text.rstrip("\\"))) % 2 == 1 or _cut_character(raw)


def _cut_character(raw: bytes) -> bool:
    """Whether `raw` ends inside a UTF-8 character (its last lead byte wants more than follow)."""
    for k in range(1, min(4, len(raw)) + 1):
        c = raw[-k]
        if c & 0xC0 != 0x80:  # ASCII or a lead byte
            return (2 if c >> 5 == 0b110 else 3 if c >> 4 == 0b1110 else 4 if c >> 3 == 0b11110 else 1) > k
    return False


_LOCK = threading.Lock()
_SPANS: dict[int, tuple[Any, Spans]] = {}  # id(LLTokenizer) (kept alive) -> its Spans


def spans(lt: Any, n_vocab: int) -> Spans:
    """An llguidance tokenizer's Spans, built once (a fraction of a second on a large vocabulary)."""
    with _LOCK:
        if id(lt) not in _SPANS:
            raws = [lt.decode_bytes([i]) if i < lt.vocab_size else b"" for i in range(n_vocab)]
            head, seg, cut = zip(*(_spans_of(r) for r in raws), strict=True)
            h = np.minimum(np.array(head), 255).astype(np.uint8)
            letter = LETTER.encode()
            _SPANS[id(lt)] = (lt, Spans(h, np.array(seg, dtype=np.int32), ~np.array(cut, dtype=np.bool_),
                                        int(h.max()), raws.index(letter) if letter in raws else None))
        return _SPANS[id(lt)][1]


class Lengths:
    """The client's maxLengths of one turn's document, held over masks of a grammar without them.
    `m`: a matcher of the grammar with them (the guide's follows the same tokens); `bounds`:
    every maxLength it holds."""

    def __init__(self, m: Any, sp: Spans, bounds: list[int]) -> None:
        self.m, self._sp = m, sp
        self._k = min(max(bounds), sp.longest) + 1  # letters asked: fewer in a free string (or room enough)
        self._risky = np.flatnonzero(sp.seg > min(bounds))  # may write more into a string than a bound
        self._fits = np.empty_like(sp.whole)  # scratch: head <= room

    def hold(self, free: Any, mask: np.ndarray[Any, np.dtype[np.bool_]]) -> None:
        """`mask` (the uncounting matcher `free`'s, after the same tokens) held to the bounds, in
        place."""
        sp, m = self._sp, self.m
        mask &= sp.whole
        for t in self._risky[mask[self._risky]].tolist():
            if not m.validate_tokens([t]):
                mask[t] = False
        if sp.letter is None:
            return
        room = m.validate_tokens([sp.letter] * self._k)
        if room < self._k and free.validate_tokens([sp.letter] * (room + 1)) > room:  # a string the client bounds
            mask &= np.less_equal(sp.head, room, out=self._fits)
