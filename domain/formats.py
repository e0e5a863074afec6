"""A job's output format: a JSON Schema (or any JSON object) its document is held to, as the
Responses API's text.format and a native job's `format` give it.  The schema's check (a
tenant's schema's limits, then what the grammar engine compiles: llguidance, torch-free), its
bounded form and its grammar.  Knows nothing of tokens or decoding (workflows/structured/)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import llguidance

from domain import schemas

#: the grammar's JSON layout: compact (no whitespace between a document's tokens), so a model
#: cannot spend its tokens on spaces and newlines
LAYOUT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
#: what `json_object` is held to: a JSON object of at most 4 members, each named by up to 16
#: identifier characters, each value any JSON value (an object of the same kind), so that it
#: closes within a token limit (the grammar engine bounds no property name: no propertyNames)
ANY_OBJECT: dict[str, Any] = {"$ref": "#/$defs/object", "$defs": {
    "object": {"type": "object", "patternProperties": {"^[A-Za-z_][A-Za-z0-9_]{0,15}$": {"$ref": "#/$defs/value"}},
               "additionalProperties": False, "maxProperties": 4},
    "value": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
                        {"$ref": "#/$defs/object"}, {"type": "array", "items": {"$ref": "#/$defs/value"}}]}}}


@dataclass(frozen=True)
class Format:
    """A turn's output format: a JSON document valid against `schema`.  `name` and `strict` are
    the client's (the Responses API's text.format); the document is held to the schema whether
    strict or not."""

    schema: dict[str, Any]
    name: str = "output"
    strict: bool = True

    @classmethod
    def of(cls, fmt: dict[str, Any] | None) -> Format | None:
        """A Responses API text.format -> its Format; None for text (or none given).  ValueError
        where it is neither text, json_object nor a json_schema setflow takes (problems)."""
        kind = (fmt or {}).get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls(ANY_OBJECT, "json_object", False)
        if kind != "json_schema":
            raise ValueError(f"text.format's type is text, json_schema or json_object; got {kind!r}")
        assert fmt is not None
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise ValueError("text.format json_schema needs its `schema`, a JSON Schema object")
        if (why := problems(schema)) is not None:
            raise ValueError(f"text.format's schema is not supported: {why}")
        return cls(schema, str(fmt.get("name") or "output"), bool(fmt.get("strict") or False))


def problems(schema: Any) -> str | None:
    """Why `schema` may not hold a turn's output (the first reason); None: it may.  A tenant's
    schema's limits (domain/schemas.py: size, depth, local $ref only, RE2 patterns), then what
    the grammar engine compiles."""
    if not isinstance(schema, dict):
        return "it is not a JSON object"
    if (why := schemas.problems(schema)) is not None:
        return why
    try:
        err = llguidance.LLMatcher.validate_grammar(grammar(schema))
    except ValueError as e:
        return f"it does not compile to a grammar: {e}"[:300]
    return f"it does not compile to a grammar: {err}"[:300] if err else None


def grammar(schema: dict[str, Any]) -> str:
    """The llguidance grammar of documents valid against `schema`, laid out compact (LAYOUT),
    bounded (bounded)."""
    return str(llguidance.LLMatcher.grammar_from_json_schema(bounded(schema), defaults=LAYOUT))  # type: ignore[arg-type]


STRING_CAP = 64  # characters of a string whose schema gives no maxLength (nor pattern, format, enum, const)
ITEMS_CAP = 16  # items of an array whose schema gives no maxItems


def bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with a bound on what it leaves unbounded: a free string at most STRING_CAP
    characters, an array at most ITEMS_CAP items, an object with named properties (that names
    every required one) no others unless it says what they are.  Every document valid against
    the bounded schema is valid against `schema`; a model that never closes a string, an array
    or a run of made-up members (a small one repeats itself) closes it by then, within its
    token limit."""
    out = copy.deepcopy(schema)
    for s in schemas.subschemas(out):
        t = s.get("type")
        kinds: list[Any] = t if isinstance(t, list) else [t]
        if "string" in kinds and not any(k in s for k in ("maxLength", "pattern", "format", "enum", "const")):
            s["maxLength"] = max(STRING_CAP, int(s.get("minLength", 0)))
        if "array" in kinds and "maxItems" not in s:
            s["maxItems"] = max(ITEMS_CAP, int(s.get("minItems", 0)))
        named = s.get("properties")
        if (isinstance(named, dict) and not any(k in s for k in ("additionalProperties", "patternProperties"))
                and all(r in named for r in s.get("required", []))):
            s["additionalProperties"] = False
    return out
