"""A schema's grammar as a guide with a budget compiles it, and the matchers a process keeps of
each grammar (warm: a deep copy each guide), with the cost and the first closing walk the guide
reads (guide.py).  Knows nothing of decoding or of torch."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import llguidance

from domain import schemas
from domain.formats import LAYOUT, bounded, grammar
from model.tokenizer import Tokenizer
from runtime.errors import Unverified
from workflows.structured import closing, lengths
from workflows.structured.lengths import Lengths
from workflows.structured.vocab import LOCK, Vocab, vocab

HELD_VOCAB = 32768  # ids from which the guide holds a client's maxLength, not the grammar (held)
CACHED = 64  # schemas whose matcher a process keeps (each a few MB at most)
#: (id(tok), n_vocab, eos, grammar) -> the grammar's first matcher (warm), its cost (cost) and
#: its closing walk from the start (closing.walk: every guide's first)
_MATCHERS: OrderedDict[tuple[int, int, int, str], tuple[Any, int, tuple[list[int], bool, bytes | None]]] = OrderedDict()


def uncapped(schema: dict[str, Any], counted: bool = True) -> str:
    """`schema`'s grammar as grammar() (domain/formats.py) compiles it, less the STRING_CAP that
    bounded() gives a free string (no maxLength, pattern, format, enum nor const of the
    client's); every other bound kept.  For a guide with a budget, which caps such a string
    itself (JsonGuide._capped) and closes the document within the budget (JsonGuide._close).
    `counted` False: less the client's maxLength too, on a string of no pattern, format, enum
    nor const (plain): the guide holds it (lengths.py)."""
    out = bounded(schema)
    for s, b in zip(schemas.subschemas(schema), schemas.subschemas(out), strict=True):  # bounded adds no subschema
        if "maxLength" in b and ("maxLength" not in s or (not counted and plain(s))):
            del b["maxLength"]
    return str(llguidance.LLMatcher.grammar_from_json_schema(out, defaults=LAYOUT))  # type: ignore[arg-type]


def plain(s: dict[str, Any]) -> bool:
    """A string subschema whose only bounds are on its length (its maxLength the guide may hold)."""
    t = s.get("type")
    return "string" in (t if isinstance(t, list) else [t]) and not any(k in s for k in ("pattern", "format", "enum", "const"))


def held(tok: Tokenizer, n_vocab: int, eos_id: int, schema: dict[str, Any]) -> Lengths | None:
    """The client's maxLengths of `schema`'s plain strings (plain), held by a matcher of the
    grammar that counts them (uncapped) beside the guide's; None: it has none, its vocabulary is
    small (below HELD_VOCAB ids the counted grammar's mask costs little more than the other's,
    and holding them costs its probes: the grammar counts), or the vocabulary has no one-letter
    token to measure a string's room with."""
    bounds = [int(s["maxLength"]) for s in schemas.subschemas(schema) if "maxLength" in s and plain(s)]
    if not bounds or n_vocab < HELD_VOCAB:
        return None
    with LOCK:
        sp = lengths.spans(vocab(tok, n_vocab, eos_id).lt, n_vocab)
    return None if sp.letter is None else Lengths(matcher(tok, n_vocab, eos_id, schema, uncapped(schema))[0], sp, bounds)


def matcher(tok: Tokenizer, n_vocab: int, eos_id: int, schema: dict[str, Any],
            g: str) -> tuple[Any, Vocab, int, tuple[list[int], bool, bytes | None]]:
    """A fresh matcher of grammar `g` (`schema`'s: grammar(), or uncapped() for a guide with a
    budget; a deep copy of the process's first one: its lexer, built lazily, kept warm), the
    tokenizer's Vocab, the grammar's cost (cost) and its closing walk from the start."""
    key = (id(tok), n_vocab, eos_id, g)
    with LOCK:
        v = vocab(tok, n_vocab, eos_id)
        if key not in _MATCHERS:
            m = llguidance.LLMatcher(v.lt, g, log_level=0)
            ok = not m.is_error()
            _MATCHERS[key] = (m, cost(bounded(schema), v, eos_id, n_vocab) if ok else 0,
                              closing.walk(m, v, eos_id, n_vocab) if ok else ([], False, None))
            if len(_MATCHERS) > CACHED:
                _MATCHERS.popitem(last=False)
        _MATCHERS.move_to_end(key)
        first, c, start = _MATCHERS[key]
        if first.is_error():
            raise Unverified(f"the schema's grammar does not load: {first.get_error()}", [])
        return first.deep_copy(), v, c, (list(start[0]), *start[1:])


def cost(schema: dict[str, Any], v: Vocab, eos: int, n_vocab: int) -> int:
    """What a value one token opens may add to a document's closing tokens (closing.walk), at
    most: the closing walk of the costliest subschema's (not the root's) smallest instance.  A
    token then adds at most its OPENERS' count times this, plus ESCAPE; JsonGuide's slack is that
    of the token with the most openers, and it closes the document from the point where its
    closing tokens are within the slack of its budget."""
    defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    c = 1
    for s in list(schemas.subschemas(schema))[1:]:  # the root's own instance is opened once, at the start
        m = llguidance.LLMatcher(v.lt, grammar({**defs, **s}), log_level=0)
        if not m.is_error():
            c = max(c, len(closing.walk(m, v, eos, n_vocab)[0]))
    return c
