"""workflows/structured/: a Responses text.format read as a Format or refused with its reason;
the bounded schema's documents valid against the client's; a document checked before it is a
success (unfinished or invalid: a failure with its code); JsonGuide a pure function of the
tokens before (rolled back and forward in any order, the masks of a fresh guide)."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from model import shipped
from model.tokenizer import Tokenizer
from runtime.errors import Unfinished, Unverified
from workflows import structured
from workflows.structured import Format, JsonGuide, closing, grammars

PERSON: dict[str, Any] = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                                           "tags": {"type": "array", "items": {"type": "string"}}},
                          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return shipped.load()[1]


def test_a_text_format_is_read_or_refused_with_its_reason() -> None:
    assert Format.of(None) is None and Format.of({"type": "text"}) is None
    assert Format.of({"type": "json_object"}) == Format(structured.ANY_OBJECT, "json_object", False)
    f = Format.of({"type": "json_schema", "name": "person", "schema": PERSON, "strict": True})
    assert f == Format(PERSON, "person", True)
    refusals = {
        "json_schema needs its `schema`": {"type": "json_schema", "name": "x"},
        "points outside the document": {"type": "json_schema", "schema": {"$ref": "https://example.com/s.json"}},
        "RE2 syntax": {"type": "json_schema", "schema": {"type": "string", "pattern": "(a)\\1"}},
        "bytes as JSON": {"type": "json_schema", "schema": {"type": "object", "description": "x" * 70_000}},
        "type is text, json_schema or json_object": {"type": "grammar"},
    }
    for why, fmt in refusals.items():
        with pytest.raises(ValueError, match=why.replace("`", ".").replace("(", ".").replace(")", ".")):
            Format.of(fmt)


def test_a_bounded_schema_closes_what_the_client_left_open_and_nothing_else() -> None:
    b = structured.bounded(PERSON)
    assert b["properties"]["name"]["maxLength"] == structured.STRING_CAP
    assert b["properties"]["tags"]["maxItems"] == structured.ITEMS_CAP
    assert b["properties"]["tags"]["items"]["maxLength"] == structured.STRING_CAP
    assert "maxLength" not in PERSON["properties"]["name"], "the client's schema is not changed"
    open_ = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert structured.bounded(open_)["additionalProperties"] is False, "no made-up members"
    for kept_open in ({**open_, "required": ["a", "b"]}, {**open_, "additionalProperties": {"type": "integer"}}):
        assert structured.bounded(kept_open) == kept_open
    kept = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                             "kind": {"type": "string", "enum": ["a", "b"]},
                                             "long": {"type": "string", "maxLength": 500}}, "additionalProperties": False}
    assert structured.bounded(kept) == kept


def test_a_document_is_checked_before_it_is_a_success() -> None:
    f = Format(PERSON)
    assert structured.document('{"name":"Ada","age":36}', f, ended=True) == {"name": "Ada", "age": 36}
    with pytest.raises(Unfinished) as e:
        structured.document('{"name":"Ada","ag', f, ended=False)
    assert e.value.code == "unfinished_document"
    with pytest.raises(Unverified) as v:
        structured.document('{"name":"Ada","age":-1}', f, ended=True)
    assert v.value.code == "unverified" and "minimum" in v.value.problems[0]
    with pytest.raises(Unverified, match="not a JSON document"):
        structured.document('{"name":', f, ended=True)


def _masks(guide: JsonGuide, text: list[int]) -> list[np.ndarray | None]:
    return [None if (m := guide.allowed(text[:k])) is None else m.copy() for k in range(len(text) + 1)]


def test_the_guide_is_a_pure_function_of_the_tokens_before(tok: Tokenizer) -> None:
    """Asked in any order (a step's run ended early, a batch's other rows, a restored session), a
    guide gives the masks a fresh one gives in order; every token of a valid document is allowed,
    EOS only once it closes, and nothing is guided after EOS."""
    cfg = shipped.load()[0].cfg
    f = Format(PERSON)
    docs = ['{"name":"Ada","age":36}', '{"name":"Bo","age":7,"tags":["x","yz"]}']
    for d in docs:
        ids = [*tok.encode(d), cfg.eos_id]
        want = _masks(JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f), ids)
        for k, m in enumerate(want[:-1]):
            assert m is not None and m[ids[k]], (d, k)
            assert m[cfg.eos_id] == (k == len(ids) - 1)
        assert want[-1] is None
        g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f)
        order = list(range(len(ids) + 1))
        random.Random(0).shuffle(order)
        for k in order:
            got = g.allowed(ids[:k])
            assert (got is None and want[k] is None) or np.array_equal(got, want[k]), (d, k)
    refused = [*tok.encode('{"name":1'), cfg.eos_id]
    assert JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f).allowed(refused[:-1]) is None, "a refused token: nothing holds"


def test_a_number_ends_within_its_cap(tok: Tokenizer) -> None:
    """A small model repeats its 0s: past NUMBER_CAP number tokens in a row, the mask keeps only
    what ends the number (where the grammar allows anything else)."""
    cfg = shipped.load()[0].cfg
    g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format({"type": "object", "properties": {"x": {"type": "number"}}}))
    before = tok.encode('{"x":1' + "0" * (structured.NUMBER_CAP - 1))
    m = g.allowed(before)
    assert m is not None and not m[tok.encode("0")[0]] and m[tok.encode("}")[0]]
    assert json.loads(tok.decode([*before, tok.encode("}")[0]]))["x"] == 10 ** (structured.NUMBER_CAP - 1)


@pytest.mark.parametrize("budget", [56, 80, 120, 200])
def test_a_document_closes_within_its_budget_whatever_the_model_writes(tok: Tokenizer, budget: int) -> None:
    """A model that wanders (here: a random token of the mask, the end of text never chosen while
    anything else is allowed) still ends with a valid document within its token budget: from the
    point where the closing tokens are within the slack of the positions left, the mask is the
    next closing token alone.  The nested benchmark schema ended unfinished_document at 256 tokens
    before."""
    from bench.grammars import SCHEMAS
    cfg = shipped.load()[0].cfg
    for seed in range(3):
        rng = random.Random(seed)
        f = Format(SCHEMAS["nested"])
        g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, budget)
        out: list[int] = []
        while (m := g.allowed(out)) is not None:
            assert len(out) < budget, "the budget passed with the document still open"
            ids = [int(i) for i in np.flatnonzero(m) if i != cfg.eos_id] or [cfg.eos_id]
            out.append(rng.choice(ids))
        assert out[-1] == cfg.eos_id and g.broken == 0
        structured.document(tok.decode(out[:-1], skip_special=True), f, ended=True)


def test_a_free_string_closes_at_its_cap_in_the_guide_not_the_grammar(tok: Tokenizer) -> None:
    """With a budget, the grammar leaves a free string uncapped (its counted characters made the
    mask dearer on a large vocabulary) and the guide caps it: from STRING_CAP characters on, the
    mask is the quote alone.  A string the client bounded keeps its own bound, a guide without a
    budget the grammar's cap."""
    cfg = shipped.load()[0].cfg
    quote = tok.encode('"')[0]
    for schema, capped in ((PERSON, True), ({**PERSON, "properties": {**PERSON["properties"],
                                             "name": {"type": "string", "maxLength": 300}}}, False)):
        g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(schema), 256)
        out = tok.encode('{"name":"')
        while len(tok.decode(out)) - len('{"name":"') < structured.STRING_CAP:
            m = g.allowed(out)
            assert m is not None and m.sum() > 1, "below the cap: the string goes on"
            out += tok.encode("abc")
        m = g.allowed(out)
        assert m is not None and (np.flatnonzero(m).tolist() == [quote]) == capped
    g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(PERSON))
    assert g.allowed(tok.encode('{"name":"' + "abc" * 21)) is not None and g.allowed(tok.encode('{"name":"' + "abc" * 22)) is None


def test_the_bench_finds_every_schema_valid_alone_and_batched_with_the_same_tokens() -> None:
    """The nested benchmark schema, prefix and set at batch 1 and 2: every document valid, the
    batched tokens those of each turn alone (bench/structured.py)."""
    from bench import structured as bench
    result = bench.main(["--quick", "--only", "nested", "--batch", "2"])
    assert result["summary"]["valid"] == 1.0 and result["summary"]["identical"]
    assert result["summary"]["bound_broken"] == 0


BOUNDED: dict[str, Any] = {"type": "object", "properties": {
    "code": {"type": "string", "maxLength": 3}, "note": {"type": ["string", "null"], "minLength": 2, "maxLength": 7},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 1}, "maxItems": 3},
    "kind": {"type": "string", "enum": ["alpha", "beta"]}, "id": {"type": "string", "pattern": "^[a-z]{2}[0-9]+$"}},
    "required": ["code", "note", "tags", "kind", "id"], "additionalProperties": False}


def _wander(g: JsonGuide, tok: Tokenizer, eos: int, seed: int, long_first: bool) -> list[int]:
    """A document a wandering model writes under `g`: a random token of each mask (the longest
    ones first where long_first: they press the strings' bounds), the end of text last."""
    rng, out = random.Random(seed), []
    while (m := g.allowed(out)) is not None:
        ids = [int(i) for i in np.flatnonzero(m) if i != eos] or [eos]
        if long_first:
            ids.sort(key=lambda i: -len(tok.decode([i])))
            ids = ids[:max(1, len(ids) // 8)]
        out.append(rng.choice(ids))
    return out


def test_a_client_bounded_string_is_held_by_the_guide_not_the_grammar(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a budget, on a large vocabulary (here the shipped one, HELD_VOCAB lowered), a
    string's maxLength (no pattern, enum...) leaves the grammar (its counted characters made
    every mask inside it dearer) and the guide holds it (workflows/structured/lengths.py): every token it
    allows is one the counting grammar accepts, the documents of a model pressing the bounds are
    valid, and at the bound only what closes the string is allowed."""
    monkeypatch.setattr(grammars, "HELD_VOCAB", 0)
    cfg = shipped.load()[0].cfg
    assert JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(BOUNDED), 120)._lengths is not None
    with monkeypatch.context() as m:
        m.setattr(grammars, "HELD_VOCAB", cfg.vocab_size + 1)
        assert JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(BOUNDED), 120)._lengths is None, "small: the grammar counts"
    f = Format(BOUNDED)
    g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, 120)
    assert g._lengths is not None
    assert grammars.uncapped(BOUNDED).count('"maxLength"') == 3 and '"maxLength"' not in grammars.uncapped(BOUNDED, counted=False)
    counted = grammars.matcher(tok, cfg.vocab_size, cfg.eos_id, BOUNDED, grammars.uncapped(BOUNDED))[0]
    for seed in range(6):
        g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, 120)
        out = _wander(g, tok, cfg.eos_id, seed, long_first=seed % 2 == 0)
        m = counted.deep_copy()
        for k, t in enumerate(out[:-1]):
            allowed = g.allowed(out[:k])
            assert allowed is not None
            for a in np.flatnonzero(allowed).tolist():
                assert a == cfg.eos_id or m.validate_tokens([a]), (tok.decode(out[:k]), tok.decode([a]))
            assert m.consume_token(t)
        doc = structured.document(tok.decode(out[:-1], skip_special=True), f, ended=True)
        assert len(doc["code"]) <= 3 and all(len(t) <= 1 for t in doc["tags"]) and g.broken == 0
    at = tok.encode('{"code":"abc')
    m = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, 120).allowed(at)
    assert m is not None and all(tok.decode([int(i)]).startswith('"') for i in np.flatnonzero(m)), "at the bound: the quote"


@pytest.mark.parametrize("name", ["nested", "bounded"])
def test_a_guide_with_a_budget_is_a_pure_function_of_the_tokens_before(tok: Tokenizer, name: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With a budget (closing walks reused from the bytes they spell, the client's bounds held by
    the guide), masks asked in any order, or of a fresh guide each, are those asked in order."""
    from bench.grammars import SCHEMAS
    monkeypatch.setattr(grammars, "HELD_VOCAB", 0)
    cfg = shipped.load()[0].cfg
    f = Format(BOUNDED if name == "bounded" else SCHEMAS[name])
    for seed, budget in ((0, 40), (1, 90), (2, 256)):
        ids = _wander(JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, budget), tok, cfg.eos_id, seed, long_first=True)
        want = _masks(JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, budget), ids)
        for k, m in enumerate(want):
            fresh = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, budget).allowed(ids[:k])
            assert (fresh is None and m is None) or np.array_equal(fresh, m), (name, budget, k)
        g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, f, budget)
        order = list(range(len(ids) + 1))
        random.Random(seed).shuffle(order)
        for k in order:
            got = g.allowed(ids[:k])
            assert (got is None and want[k] is None) or np.array_equal(got, want[k]), (name, budget, k)


def test_a_guide_keeps_the_masks_a_step_asks_again_and_drops_those_a_rollback_leaves(tok: Tokenizer) -> None:
    """A step asks the position its last step's run stopped at again as its first: the guide
    hands back the mask it kept (the same array, no new mask computed, the matcher not moved)
    while its tokens still begin with that `before`; a rollback past a kept mask drops it."""
    cfg = shipped.load()[0].cfg
    ids = tok.encode('{"name":"Ada","age":36}')
    g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(PERSON), 256)
    n = len(ids)
    first = [g.allowed(ids[:k]) for k in range(n - 4, n)]  # a step's positions, the last the kept's
    computed, consumed = len(g.mask_s), list(g._ids)
    assert all(g.allowed(ids[:n - 4 + j]) is first[j] for j in (3, 1, 2)) and len(g.mask_s) == computed and g._ids == consumed
    k = next(k for k in range(n - 4, n) if np.count_nonzero(first[k - n + 4]) > 1)  # a choice: another token allowed
    other = [*ids[:k], next(int(t) for t in np.flatnonzero(first[k - n + 4]) if t != ids[k])]
    assert g.allowed(other) is not None and all(j not in g._masks for j in range(k + 2, n))  # k + 1: other's own
    fresh = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(PERSON), 256)
    assert np.array_equal(g.allowed(ids[:n - 1]), fresh.allowed(ids[:n - 1])) and len(g.mask_s) == computed + 2


def test_a_walk_reads_the_lowest_allowed_id_off_the_packed_mask(tok: Tokenizer) -> None:
    """closing.lowest (the walk's step where no forced byte and no closer is allowed): the lowest
    allowed one-byte id, else the lowest allowed id, as the unpacked mask gives them."""
    from bench.grammars import SCHEMAS
    cfg = shipped.load()[0].cfg
    g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(SCHEMAS["nested"]))
    v = g._v
    for text in ['{"metric":"', '{"metric":"a","period":{"from":"x","to":"y"},"rows":[{"name":"n","value":1,"change":"',
                 '{"metric":"a","period":{"from":"x","to":"y"},"rows":[{"name":"n","value":']:
        m = g.allowed(tok.encode(text))
        assert m is not None
        ones = np.flatnonzero(m & np.isin(np.arange(cfg.vocab_size), v.singles))
        want = (int(ones[0]), True) if len(ones) else (int(np.flatnonzero(m)[0]), False)
        assert closing.lowest(g._m, v, cfg.vocab_size) == want, text


def test_the_closing_slack_is_the_masks_own(tok: Tokenizer) -> None:
    """What one token may add to the closing tokens is read from the tokens the mask allows
    (their most openers), never more than the vocabulary's most: inside a number (no opener
    allowed but its ends) the slack is less than the guide's."""
    from bench.grammars import SCHEMAS
    cfg = shipped.load()[0].cfg
    g = JsonGuide(tok, cfg.vocab_size, cfg.eos_id, Format(SCHEMAS["nested"]), 256)
    for text in ['{"metric":"', '{"metric":"a","period":{"from":"x","to":"y"},"rows":[{"name":"n","value":1']:
        m = g.allowed(tok.encode(text))
        assert m is not None
        most = max(g._v.opens[int(t)] for t in np.flatnonzero(m))
        assert g._slack_of(m) == most * g._cost + 6 <= g._slack
