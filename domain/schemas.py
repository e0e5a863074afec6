"""A tenant's JSON Schema is data, never a program.

A schema a tenant sends (a function tool's `parameters`) is checked once, at submission, by
`problems()`: it is at most MAX_BYTES as JSON and MAX_DEPTH deep; every `$ref` and `$dynamicRef`
points inside the document (`#...`) and no `$id` rebases it; every regular expression (`pattern`,
the names of `patternProperties`) is at most MAX_PATTERN characters and compiles under RE2, a
linear-time engine.  `validator()` then checks arguments against it with RE2 for every pattern and
a registry that retrieves nothing, so a validation neither fetches nor backtracks: its time is
linear in the schema and the arguments, whatever either holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import jsonschema
import re2
import referencing

_Errors = Iterator[jsonschema.ValidationError]

MAX_BYTES = 64 * 1024  # the schema as compact JSON
MAX_DEPTH = 32  # nested objects and arrays
MAX_PATTERN = 1000  # characters of one regular expression

#: keywords whose value is one subschema, a list of them, or a map of names to them (2020-12,
#: and the older drafts' spellings a tenant's tool may still use)
_ONE = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_REFS = ("$ref", "$dynamicRef")


def _depth(doc: Any) -> int:
    """How deep objects and arrays nest in `doc`, counted without recursion."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, d = todo.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:  # deeper than the cap: already refused, no need to look further
                todo.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every subschema of `schema`, itself first, by the keywords that hold subschemas (the values
    of enum, const, default and examples are data and are not walked); each the object itself,
    so a caller may change a copy of the schema in place."""
    todo = [schema]
    while todo:
        s = todo.pop()
        if not isinstance(s, dict):
            continue
        yield s
        for k in _ONE:
            if isinstance(s.get(k), dict):
                todo.append(s[k])
        for k in _LIST:
            if isinstance(s.get(k), list):
                todo.extend(s[k])
        for k in _MAP:
            if isinstance(s.get(k), dict):
                todo.extend(s[k].values())


def _patterns(s: dict[str, Any]) -> list[str]:
    """The regular expressions one subschema runs: its pattern and its patternProperties' names."""
    found = [s["pattern"]] if isinstance(s.get("pattern"), str) else []
    return found + (list(s["patternProperties"]) if isinstance(s.get("patternProperties"), dict) else [])


@lru_cache(maxsize=1024)
def _re2(pattern: str) -> Any:
    return re2.compile(pattern)


def problems(schema: Any) -> str | None:
    """Why `schema` may not be a tenant's schema (the first reason); None: it may."""
    if _depth(schema) > MAX_DEPTH:
        return f"it nests deeper than {MAX_DEPTH} levels"
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError):
        return "it is not a JSON document"
    if size > MAX_BYTES:
        return f"it is {size} bytes as JSON; at most {MAX_BYTES}"
    subs = list(subschemas(schema))
    if any("patternProperties" in s for s in subs) and any("unevaluatedProperties" in s for s in subs):
        return "unevaluatedProperties beside patternProperties is not supported"  # jsonschema would run Python's re
    for s in subs:
        if "$id" in s:
            return "$id is not allowed: a tool's schema is one document"
        for k in _REFS:
            if k in s and not (isinstance(s[k], str) and s[k].startswith("#")):
                return f"{k} {str(s[k])[:80]!r} points outside the document; only local references ('#/$defs/...') are allowed"
        for p in _patterns(s):
            if len(p) > MAX_PATTERN:
                return f"a pattern is {len(p)} characters long; at most {MAX_PATTERN}"
            try:
                _re2(p)
            except re2.error as e:
                return f"pattern {p[:80]!r} is not supported ({e}); patterns use RE2 syntax: no backreferences or lookaround"
    try:
        _Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        return f"it is not a JSON Schema: {e.message}"[:300]
    return None


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> _Errors:
    if validator.is_type(instance, "string") and not _re2(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, pp: dict[str, Any], instance: Any, schema: dict[str, Any]) -> _Errors:
    if validator.is_type(instance, "object"):
        for pattern, sub in pp.items():
            for k, v in instance.items():
                if _re2(pattern).search(k):
                    yield from validator.descend(v, sub, path=k, schema_path=pattern)


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: dict[str, Any]) -> _Errors:
    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), [_re2(p) for p in schema.get("patternProperties", {})]
    extras = sorted(k for k in instance if k not in named and not any(p.search(k) for p in patterns))
    if validator.is_type(ap, "object"):
        for k in extras:
            yield from validator.descend(instance[k], ap, path=k)
    elif ap is False and extras:
        yield jsonschema.ValidationError(f"additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)")


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    validators={"pattern": _pattern, "patternProperties": _pattern_properties,
                "additionalProperties": _additional_properties})


def validator(schema: dict[str, Any]) -> Any:
    """A validator of arguments against a schema problems() took: RE2 for every pattern, and a
    registry with nothing to retrieve (a reference outside the document is unresolvable)."""
    return _Validator(schema, registry=referencing.Registry())
