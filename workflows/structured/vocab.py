"""A tokenizer's llguidance twin and what the JSON guide reads of each id (workflows/structured/
guide.py): built once a process per tokenizer.  Knows nothing of schemas or of torch."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import llguidance
import numpy as np

from model.tokenizer import Tokenizer

NUMERIC = frozenset("0123456789.eE+-")  # a number's characters
OPENERS = '{[",:'  # a token's characters that may open a value (an object, an array, a string, a member, an item)
CLOSERS = ("}", "]", '"', ",", "0", ":")  # what closes a document soonest, first first (closing.py walk)


@dataclass(frozen=True)
class Vocab:
    """A tokenizer's llguidance twin and what JsonGuide reads of its ids."""

    lt: Any  # llguidance.LLTokenizer
    numeric: np.ndarray[Any, np.dtype[np.bool_]]  # (n_vocab,) ids that are a number's characters only
    closers: list[int]  # the ids of CLOSERS it has, in CLOSERS' order
    # tuples, not lists: of ints and bools only, the collector stops tracking them (a list of a
    # large vocabulary's ids is walked at every full collection: part of a 4-6 ms pause)
    opens: tuple[int, ...]  # (n_vocab,) each token's brackets, quotes, commas and colons: values it may open
    stays: tuple[bool, ...]  # (n_vocab,) a token of no quote and no backslash: inside a free string, it stays there
    openers: int  # the most brackets, quotes, commas and colons one token holds (at least 1)
    quoted: tuple[bool, ...]  # (n_vocab,) a token with a quote
    chars: tuple[int, ...]  # (n_vocab,) each token's characters
    tail: tuple[int, ...]  # (n_vocab,) each token's characters after its last quote
    quote: int | None  # the id of '"' (JsonGuide._capped)
    letter: int | None  # the id of "a": a character a string takes and nothing else does
    raw: tuple[bytes, ...]  # (n_vocab,) each token's bytes, as the grammar engine reads them
    singles: np.ndarray[Any, np.dtype[np.intp]]  # the ids of one byte, ascending
    #: (n, the ids of n openers) for each n >= 1 the vocabulary has, the most first: a mask's
    #: most openers, read from the few ids of many before the many of one (JsonGuide._slack_of)
    openings: tuple[tuple[int, np.ndarray[Any, np.dtype[np.intp]]], ...]
    forced: dict[bytes, list[int]] = field(default_factory=dict)  # bytes -> their tokens (closing.py tokens)


LOCK = threading.Lock()  # held while a vocabulary or a grammar's matcher is built (grammars.py)
_VOCABS: dict[tuple[int, int, int], tuple[Tokenizer, Vocab]] = {}  # id(tok) (kept alive), n_vocab, eos ->


def vocab(tok: Tokenizer, n_vocab: int, eos_id: int) -> Vocab:
    """The tokenizer's Vocab, built once (about a second on a large vocabulary); under LOCK."""
    key = (id(tok), n_vocab, eos_id)
    if key not in _VOCABS:
        texts = [tok.decode([i]) if i < tok.vocab_size else "" for i in range(n_vocab)]
        first: dict[str, int] = {}
        for i, t in enumerate(texts):
            first.setdefault(t, i)
        lt = llguidance.LLTokenizer(tok.to_str(), n_vocab=n_vocab, eos_token=eos_id)
        raw = tuple(lt.decode_bytes([i]) if i < lt.vocab_size else b"" for i in range(n_vocab))
        opens = np.array([sum(t.count(c) for c in OPENERS) for t in texts], dtype=np.intp)
        _VOCABS[key] = (tok, Vocab(
            lt,
            np.array([t != "" and set(t) <= NUMERIC for t in texts], dtype=np.bool_),
            [first[c] for c in CLOSERS if c in first],
            tuple(opens.tolist()),
            tuple('"' not in t and "\\" not in t for t in texts),
            max(1, int(opens.max())),
            tuple('"' in t for t in texts), tuple(len(t) for t in texts), tuple(len(t) - 1 - t.rfind('"') for t in texts),
            first.get('"'), first.get("a"), raw, np.array([i for i, b in enumerate(raw) if len(b) == 1], dtype=np.intp),
            tuple((int(n), np.flatnonzero(opens == n)) for n in sorted(set(opens.tolist()) - {0}, reverse=True))))
    return _VOCABS[key][1]
