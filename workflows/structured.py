"""Structured output: a turn's text held to a JSON Schema.  The schema is checked at submission
(domain/formats.py problems: domain/schemas.py's limits, then the grammar engine's own),
compiled to a grammar (llguidance: torch-free, so the API checks with the engine the workers
decode with), and the turn is decoded under JsonGuide, whose next-token mask is the grammar's; the document it ends
with is read back and validated (document) before it is returned as a success.

What "completable" means here: a step commits a token only where the committed text, that
token included, is a prefix of some document the grammar accepts.  Under a guide, decoding
commits only the unbroken run from the leftmost open position (model/policy.py guided), each
token masked in order against the tokens really before it, so under every policy (ar, prefix,
set, block) this is a prefix mask.  Commits out of order under a grammar (a token right of an
open position, checked for completability with the gap left open) are not done here.

Knows nothing of the model's forward or of torch; the mask is a numpy array."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import llguidance
import llguidance.numpy as lnp
import numpy as np

from domain import schemas
from domain.formats import ANY_OBJECT as ANY_OBJECT
from domain.formats import ITEMS_CAP as ITEMS_CAP
from domain.formats import LAYOUT as LAYOUT
from domain.formats import STRING_CAP as STRING_CAP
from domain.formats import Format as Format
from domain.formats import bounded as bounded
from domain.formats import grammar as grammar
from domain.formats import problems as problems
from model.params import DecodeParams
from model.profiles import Profile
from model.tokenizer import Tokenizer
from runtime.errors import BadInput, Unfinished, Unverified
from workflows import lengths
from workflows.lengths import Lengths
from workflows.turn import Turns, ended, text_of, turn_input

NUMBER_CAP = 16  # tokens of a number's characters in a row, where the grammar allows another token (JsonGuide)
NUMERIC = frozenset("0123456789.eE+-")  # a number's characters
OPENERS = '{[",:'  # a token's characters that may open a value (an object, an array, a string, a member, an item)
ESCAPE = 6  # what a token may add to the closing tokens besides the values it opens: an escape's \uXXXX, "n" -> "ull"
CLOSERS = ("}", "]", '"', ",", "0", ":")  # what closes a document soonest, first first (_closing)
WALK_LIMIT = 4096  # tokens of a closing walk that has not closed by then (it never will: _closing)

def requested(text: dict[str, Any] | None) -> Format | None:
    """A Responses request's `text` field -> the Format it asks for (None: text).  ValueError
    with the reason where its format is not one setflow writes."""
    return Format.of((text or {}).get("format"))


def planned(spec: dict[str, Any], text: dict[str, Any] | None) -> dict[str, Any]:
    """A response's job spec, refused (BadInput) where it asks for a JSON document from the
    agent (tools the model calls): a structured answer of the agent is not written yet."""
    if spec.get("mode") == "agent" and requested(text) is not None:
        raise BadInput("text.format json_schema and json_object are written for a response without tools the model "
                       "calls (setflow_metric, setflow_calc, a function it calls); drop the tools or the format")
    return spec


def document(text: str, fmt: Format, ended: bool) -> Any:
    """The turn's text as its document, checked: Unfinished where the turn stopped before the
    document closed (its token limit), Unverified where it is not valid against the schema
    (never returned as a success)."""
    if not ended:
        raise Unfinished("the output reached its token limit before its JSON document closed; "
                         "raise max_output_tokens or ask for a smaller document", [text[-200:]])
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise Unverified(f"the output is not a JSON document: {e}", [text[-200:]]) from None
    errors = [e.message for e in schemas.validator(fmt.schema).iter_errors(doc)]
    if errors:
        raise Unverified("the output's document is not valid against the schema", errors[:8])
    return doc


HELD_VOCAB = 32768  # ids from which the guide holds a client's maxLength, not the grammar (_held)
FORMAT_PROMPT = "Write it as one JSON document."  # the document turn's input after a job's text
DOCUMENT_TOKENS = 256  # the document turn's token limit (a Responses text's own); the job's if smaller
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def written(turns: Turns, fmt: Format, text: str, params: DecodeParams) -> Any:
    """A native job's document (its spec's `format`): one more turn on its session after the
    text it wrote (checked already), decoded under the format's grammar within DOCUMENT_TOKENS
    (or the job's smaller limit), then checked (document).  Its numbers are facts: each must be one the text
    states (Unverified where it is not, as an answer's is); its strings are not read back."""
    ids = turn_input(turns.profile, turns.tokenizer, FORMAT_PROMPT)
    params = replace(params, max_new_tokens=min(params.max_new_tokens, DOCUMENT_TOKENS))
    guide = JsonGuide(turns.tokenizer, turns.cfg.vocab_size, turns.cfg.eos_id, fmt, params.max_new_tokens)
    r = turns.turn(ids, replace(params, guide=guide), text=FORMAT_PROMPT)
    doc = document(text_of(turns, r.tokens), fmt, ended(turns, r.tokens))
    stated = {float(n) for n in NUMBER.findall(text.replace(",", ""))}
    unstated = [n for n in _numbers(doc) if float(n) not in stated]
    if unstated:
        raise Unverified("the document states a number its text does not", [f"{n} is not in the text" for n in unstated[:8]])
    return doc


def document_positions(fmt: dict[str, Any] | None, tok: Tokenizer, profile: Profile) -> int:
    """Positions a job's document turn appends at most (0: no format): its input and its limit."""
    return 0 if Format.of(fmt) is None else len(turn_input(profile, tok, FORMAT_PROMPT)) + DOCUMENT_TOKENS


def _numbers(doc: Any) -> list[int | float]:
    """Every number in a JSON document (not its booleans), in order."""
    if isinstance(doc, dict):
        return [n for v in doc.values() for n in _numbers(v)]
    if isinstance(doc, list):
        return [n for v in doc for n in _numbers(v)]
    return [doc] if isinstance(doc, (int, float)) and not isinstance(doc, bool) else []


class JsonGuide:
    """A turn's guide to a JSON Schema (model.params MaskGuide): before each position, the
    grammar's mask of the tokens that may follow what is before it; after the end of text (EOS),
    no guidance (the turn has ended there).  A pure function of the tokens before: one matcher
    follows them, rolled back to where a new `before` leaves the last one and fed the rest.
    `mask_s` keeps each mask's time (the benchmark's).

    With a `budget` (the turn's token limit), the document closes within it whatever the model
    writes: from where its closing tokens (_closing) come within the grammar's slack of the
    positions left, the mask is the next closing token alone (_close).  Its grammar then leaves a
    free string uncapped (_grammar): the cap's grammar (a string's characters counted to
    STRING_CAP) made the mask several times dearer on a large vocabulary.  The guide caps it
    instead (_capped): from STRING_CAP characters on, the mask is the string's quote alone.  On
    a large vocabulary (HELD_VOCAB) it leaves the client's maxLength out too, and a matcher of the
    grammar that counts it, beside this one, holds it (_held, workflows/lengths.py).  Without a
    budget the grammar's cap and bounds hold (domain/formats.py bounded)."""

    def __init__(self, tok: Tokenizer, n_vocab: int, eos_id: int, fmt: Format, budget: int | None = None) -> None:
        self._eos, self._n, self._budget = eos_id, n_vocab, budget
        if budget is None:
            self._m, self._v, self._cost, start = _matcher(tok, n_vocab, eos_id, fmt.schema, grammar(fmt.schema))
            self._lengths: Lengths | None = None
        else:  # the client's maxLengths held by the guide where it can (_held), not counted by the grammar
            self._lengths = _held(tok, n_vocab, eos_id, fmt.schema)
            g = _grammar(fmt.schema, counted=self._lengths is None)
            self._m, self._v, self._cost, start = _matcher(tok, n_vocab, eos_id, fmt.schema, g)
        self._slack = self._v.openers * self._cost + ESCAPE  # what one token may add to the closing tokens
        self._ids: list[int] = []  # what the matcher has consumed
        self._mask: np.ndarray[Any, np.dtype[np.bool_]] | None = None  # its mask after them
        self._bits = lnp.allocate_token_bitmask(1, n_vocab)  # (1, n_vocab / 32) int32, C-contiguous
        self._ptr, self._bytes = self._bits.ctypes.data, self._bits.nbytes
        #: (at, the closing tokens from ids[:at] (None: not tokenized yet), whether ids[:at] ends
        #: inside a free string: its quote first, then what follows it whatever quiet tokens the
        #: string goes on with, the closing bytes the tokens spell (None where the walk took a
        #: choice of several bytes) and whether they close the document: the end of text last)
        self._plan: tuple[int, list[int] | None, bool, bytes | None, bool] | None = (0, *start, start[0][-1:] == [eos_id])
        self._rise: list[tuple[int, bool]] = [(0, True)]  # _close's sums over the plan's tokens since
        self.mask_s: list[float] = []  # each mask's time, its closing walk's (walk_s) included
        self.walk_s: list[float] = []  # each mask's closing-walk part (_close)
        self.broken = 0  # closing walks longer than their bound said (the benchmark checks: 0)

    def allows(self, before: Sequence[int], token: int) -> bool | None:
        a = self.allowed(before)
        return None if a is None else bool(a[token])

    def allowed(self, before: Sequence[int]) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
        if self._eos in before:
            return None
        if not self._follow(before):
            return None  # a token the grammar refuses is before: nothing holds (document() says so)
        if self._mask is None:
            t0 = time.perf_counter()
            close = self._close(len(before))
            self.walk_s.append(time.perf_counter() - t0)
            if close is None and self._budget is not None:
                close = self._capped(before)
            if close is not None:
                self._mask = np.zeros(self._n, dtype=np.bool_)
                self._mask[close] = True
            else:
                self._m.unsafe_compute_mask_ptr(self._ptr, self._bytes)  # lnp.fill_next_token_bitmask, unchecked
                self._mask = np.unpackbits(self._bits.view(np.uint8), count=self._n, bitorder="little").view(np.bool_)
                num = self._v.numeric
                if before and num[before[-1]] and len(before) >= NUMBER_CAP and all(num[t] for t in before[-NUMBER_CAP:]):
                    if (self._mask & ~num).any():  # a number ends (a small model repeats its 0s)
                        self._mask &= ~num
                if self._lengths is not None:
                    self._lengths.hold(self._m, self._mask)
            self.mask_s.append(time.perf_counter() - t0)
        return self._mask

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

    def _close(self, at: int) -> int | None:
        """The token that must come next for the document to close within the budget (the first
        of its closing tokens, _closing); None: any token the grammar allows may come.  It must
        once the closing tokens are within the slack (what one token may add to them: _cost) of
        the positions left.  The closing walk is redone only where a bound on its length says
        it may be that close: the last walk's length, plus for each token since that is not the
        walk's own what it may add (its OPENERS' count times the grammar's cost, plus ESCAPE).
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
        bound = sys.maxsize
        if self._plan is not None:
            at0, path, free, walk, closed = self._plan
            n = at - at0
            rise = self._rise  # rise[i]: what ids[at0:at0 + i] may add, and whether each stays in a string
            for t in self._ids[at0 + len(rise) - 1:at]:
                r, stays = rise[-1]
                rise.append((r + self._v.opens[t] * self._cost + ESCAPE, stays and self._v.stays[t]))
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
                    if len(walk) + closed + self._slack < left:  # no more tokens than bytes
                        return None
                    path = _tokens(self._v, walk) + [self._eos] * closed
                    self._plan = (at, path, self._plan[2], walk, closed)
                return None if len(path) + self._slack < left else path[0]
            bound = (len(path) if path is not None else len(walk or b"") + closed) + rise[n][0]
            if bound + self._slack < left:
                return None
        path, free, walk = _closing(self._m, self._v, self._eos, self._n)
        if len(path) > bound:
            self.broken += 1
        self._plan, self._rise = (at, path, free, walk, path[-1:] == [self._eos]), [(0, True)]
        return path[0] if len(path) + self._slack >= left else None

    def _follow(self, before: Sequence[int]) -> bool:
        """Bring the matcher to `before`; False where it refuses one of its tokens."""
        ids, n = self._ids, min(len(before), len(self._ids))
        k = n if list(before[:n]) == (ids if n == len(ids) else ids[:n]) else next(i for i in range(n) if before[i] != ids[i])
        if k == len(ids) == len(before):
            return True
        if k < len(ids):
            self._m.rollback(len(ids) - k)
            if self._lengths is not None:
                self._lengths.m.rollback(len(ids) - k)
            del ids[k:]
            if self._plan is not None and self._plan[0] > k:
                self._plan = None
            elif self._plan is not None:
                del self._rise[k - self._plan[0] + 1:]
        rest = list(before[k:])
        self._mask = None
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


def _closing(m: Any, v: _Vocab, eos: int, n_vocab: int, limit: int = WALK_LIMIT) -> tuple[list[int], bool, bytes | None]:
    """Tokens that take matcher `m` from its state to a closed document, the end of text last:
    a greedy walk (the grammar's forced bytes, tokenized: _forced; else the first of v.closers
    it allows, else its lowest allowed one-byte token, else its lowest allowed id), `m` left
    where it was.  Longer than `limit` tokens (a walk that never closes): what it walked, cut
    there, without the end of text (one limit for every walk, whatever the budget: the walk
    from a state of another walk is the rest of it).  And whether `m` is inside a free string (one both brackets may go
    on: no pattern, no enum), which the walk's quote closes; and the walk's bytes (None where it
    took a token of several bytes by choice, not forced: then it is not one byte at a time).
    The tokens are the bytes tokenized as one (_tokens): the same from any state of the walk."""
    took: list[int] = []
    free, exact = False, True
    while len(took) <= limit:
        if m.is_accepting():
            break
        step: list[int] | None = _forced(m, v)
        if not step:
            ok = (t for t in v.closers if m.validate_tokens([t]))
            first = next(ok, None)
            if first == v.closers[0] and next(ok, None) == v.closers[1]:  # both brackets: inside a string
                first = next(ok, None)
                free = free or (not took and first == v.closers[2])  # its quote closes it
            step = None if first is None else [first]
        if step is None:
            bits = lnp.allocate_token_bitmask(1, n_vocab)
            lnp.fill_next_token_bitmask(m, bits, 0)
            allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:n_vocab].view(np.bool_)
            ids = np.flatnonzero(allowed & v.single)
            if not len(ids):
                ids, exact = np.flatnonzero(allowed), False
            step = [int(ids[0])] if len(ids) and ids[0] != eos else []
        n = m.try_consume_tokens(step) if step else 0
        if n == 0:
            break
        took.extend(step[:n])
    closed = m.is_accepting()
    m.rollback(len(took))
    walk = b"".join(v.raw[t] for t in took)
    if len(took) > limit:
        return _tokens(v, walk), free, None
    path = _tokens(v, walk) if exact else took
    return path + [eos] * closed, free, walk if exact else None


def _tokens(v: _Vocab, b: bytes) -> list[int]:
    """Bytes as the vocabulary's tokens (llguidance's tokenizer), kept per byte string (_forced)."""
    ids = v.forced.get(b)
    if ids is None:
        if len(v.forced) >= FORCED_CACHED:
            v.forced.clear()
        ids = v.forced[b] = list(v.lt.tokenize_bytes(b))
    return ids


FORCED_CACHED = 4096  # forced byte strings whose tokens a vocabulary keeps (a schema's names and punctuation)


def _forced(m: Any, v: _Vocab) -> list[int]:
    """The tokens of the bytes matcher `m` must take next (none: a choice is open), tokenized
    once per byte string: llguidance's forced tokens cost 15-30 us a step on a large vocabulary
    (they heal the last token), its forced bytes 2 us and a cached tokenization nothing."""
    b = m.compute_ff_bytes()
    return _tokens(v, b) if b else []


@dataclass(frozen=True)
class _Vocab:
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
    single: np.ndarray[Any, np.dtype[np.bool_]]  # (n_vocab,) ids of one byte
    forced: dict[bytes, list[int]] = field(default_factory=dict)  # bytes -> their tokens (_tokens)


_LOCK = threading.Lock()
_VOCABS: dict[tuple[int, int, int], tuple[Tokenizer, _Vocab]] = {}  # id(tok) (kept alive), n_vocab, eos ->
#: (id(tok), n_vocab, eos, grammar) -> the grammar's first matcher (warm), its cost (_cost) and
#: its closing walk from the start (_closing: every guide's first)
_MATCHERS: OrderedDict[tuple[int, int, int, str], tuple[Any, int, tuple[list[int], bool, bytes | None]]] = OrderedDict()
CACHED = 64  # schemas whose matcher a process keeps (each a few MB at most)


def _vocab(tok: Tokenizer, n_vocab: int, eos_id: int) -> _Vocab:
    """The tokenizer's _Vocab, built once (about a second on a large vocabulary); under _LOCK."""
    key = (id(tok), n_vocab, eos_id)
    if key not in _VOCABS:
        texts = [tok.decode([i]) if i < tok.vocab_size else "" for i in range(n_vocab)]
        first: dict[str, int] = {}
        for i, t in enumerate(texts):
            first.setdefault(t, i)
        lt = llguidance.LLTokenizer(tok.to_str(), n_vocab=n_vocab, eos_token=eos_id)
        raw = tuple(lt.decode_bytes([i]) if i < lt.vocab_size else b"" for i in range(n_vocab))
        _VOCABS[key] = (tok, _Vocab(
            lt,
            np.array([t != "" and set(t) <= NUMERIC for t in texts], dtype=np.bool_),
            [first[c] for c in CLOSERS if c in first],
            tuple(sum(t.count(c) for c in OPENERS) for t in texts),
            tuple('"' not in t and "\\" not in t for t in texts),
            max(1, max(sum(t.count(c) for c in OPENERS) for t in texts)),
            tuple('"' in t for t in texts), tuple(len(t) for t in texts), tuple(len(t) - 1 - t.rfind('"') for t in texts),
            first.get('"'), first.get("a"), raw, np.array([len(b) == 1 for b in raw], dtype=np.bool_)))
    return _VOCABS[key][1]


def _grammar(schema: dict[str, Any], counted: bool = True) -> str:
    """`schema`'s grammar as grammar() (domain/formats.py) compiles it, less the STRING_CAP that
    bounded() gives a free string (no maxLength, pattern, format, enum nor const of the
    client's); every other bound kept.  For a guide with a budget, which caps such a string
    itself (JsonGuide._capped) and closes the document within the budget (JsonGuide._close).
    `counted` False: less the client's maxLength too, on a string of no pattern, format, enum
    nor const (_plain): the guide holds it (workflows/lengths.py)."""
    out = bounded(schema)
    for s, b in zip(schemas.subschemas(schema), schemas.subschemas(out), strict=True):  # bounded adds no subschema
        if "maxLength" in b and ("maxLength" not in s or (not counted and _plain(s))):
            del b["maxLength"]
    return str(llguidance.LLMatcher.grammar_from_json_schema(out, defaults=LAYOUT))  # type: ignore[arg-type]


def _plain(s: dict[str, Any]) -> bool:
    """A string subschema whose only bounds are on its length (its maxLength the guide may hold)."""
    t = s.get("type")
    return "string" in (t if isinstance(t, list) else [t]) and not any(k in s for k in ("pattern", "format", "enum", "const"))


def _held(tok: Tokenizer, n_vocab: int, eos_id: int, schema: dict[str, Any]) -> Lengths | None:
    """The client's maxLengths of `schema`'s plain strings (_plain), held by a matcher of the
    grammar that counts them (_grammar) beside the guide's; None: it has none, its vocabulary is
    small (below HELD_VOCAB ids the counted grammar's mask costs little more than the other's,
    and holding them costs its probes: the grammar counts), or the vocabulary has no one-letter
    token to measure a string's room with."""
    bounds = [int(s["maxLength"]) for s in schemas.subschemas(schema) if "maxLength" in s and _plain(s)]
    if not bounds or n_vocab < HELD_VOCAB:
        return None
    with _LOCK:
        sp = lengths.spans(_vocab(tok, n_vocab, eos_id).lt, n_vocab)
    return None if sp.letter is None else Lengths(_matcher(tok, n_vocab, eos_id, schema, _grammar(schema))[0], sp, bounds)


def _matcher(tok: Tokenizer, n_vocab: int, eos_id: int, schema: dict[str, Any],
             g: str) -> tuple[Any, _Vocab, int, tuple[list[int], bool, bytes | None]]:
    """A fresh matcher of grammar `g` (`schema`'s: grammar(), or _grammar() for a guide with a
    budget; a deep copy of the process's first one: its lexer, built lazily, kept warm), the
    tokenizer's _Vocab, the grammar's cost (_cost) and its closing walk from the start."""
    key = (id(tok), n_vocab, eos_id, g)
    with _LOCK:
        v = _vocab(tok, n_vocab, eos_id)
        if key not in _MATCHERS:
            m = llguidance.LLMatcher(v.lt, g, log_level=0)
            ok = not m.is_error()
            _MATCHERS[key] = (m, _cost(bounded(schema), v, eos_id, n_vocab) if ok else 0,
                              _closing(m, v, eos_id, n_vocab) if ok else ([], False, None))
            if len(_MATCHERS) > CACHED:
                _MATCHERS.popitem(last=False)
        _MATCHERS.move_to_end(key)
        first, cost, start = _MATCHERS[key]
        if first.is_error():
            raise Unverified(f"the schema's grammar does not load: {first.get_error()}", [])
        return first.deep_copy(), v, cost, (list(start[0]), *start[1:])


def _cost(schema: dict[str, Any], v: _Vocab, eos: int, n_vocab: int) -> int:
    """What a value one token opens may add to a document's closing tokens (_closing), at most:
    the closing walk of the costliest subschema's (not the root's) smallest instance.  A token
    then adds at most its OPENERS' count times this, plus ESCAPE; JsonGuide's slack is that of
    the token with the most openers, and it closes the document from the point where its closing
    tokens are within the slack of its budget."""
    defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    cost = 1
    for s in list(schemas.subschemas(schema))[1:]:  # the root's own instance is opened once, at the start
        m = llguidance.LLMatcher(v.lt, grammar({**defs, **s}), log_level=0)
        if not m.is_error():
            cost = max(cost, len(_closing(m, v, eos, n_vocab)[0]))
    return cost
