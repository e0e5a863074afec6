"""A client's function of several parameters, its arguments taken from the question by
construction (`get_weather(city, unit)`, `get_forecast(city, days)`): the model writes one of
them, a text (the calculator's call shape, `calc("Paris")`: the one call of one text it was
trained to write), guided whole to the one name the question gives it; the runtime fills each
other parameter from what the question writes for it, and nothing else:

- an `enum`'s value the question writes whole (any case; a value of one letter only as a
  capital standing alone, "°F", "in C", never the words "a" and "I");
- a number (integer or number) the question writes as a number next to a word of the
  parameter's name ("in 3 days": `days`; "limit 5");
- a boolean only where the question writes the parameter's name then true or false
  ("alerts=true");
- a free string the one name the question writes (`candidates`) that fits the parameter's own
  schema; two or more free strings are told apart only where their schemas leave each one name
  (a `pattern`, a length); an optional one is filled only where its `pattern` fits one name.

A required parameter the question gives no value for, or two values for (two names that fit a
free string: which it means cannot be told, and the model's guess would be a call about the
other), is why the function is not called (`Binding.missing`), never a value made up.  An
optional one it gives none for is left out.  Pure: no torch, no decoding."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from domain import schemas
from domain.answers import asks_arithmetic
from domain.tools import NUMBER, holds, question_names

MAX_PARAMETERS = 4  # a function's parameters that can be filled so (issue 52: 1 to 4)
MAX_WAYS = 4096  # ways to give the free strings names that are tried, at most (4 of 8 names each)
_BOOLEAN = {"true": True, "false": False}
_WORD = re.compile(r"[^\s]+")
_SPLIT = re.compile(r"[=:]")


def kind(prop: Any) -> str | None:
    """What a parameter's schema asks, as filled here: "enum" (strings), "string", "integer",
    "number", "boolean"; None: anything else (an object, an array, a union), never filled."""
    if not isinstance(prop, dict):
        return None
    if "enum" in prop:
        values = prop["enum"]
        ok = isinstance(values, list) and values and all(isinstance(v, str) for v in values)
        return "enum" if ok and prop.get("type", "string") == "string" else None
    t = prop.get("type")
    return t if t in ("string", "integer", "number", "boolean") else None


def fits(parameters: dict[str, Any] | None) -> bool:
    """A function whose arguments can be filled so: an object of 1 to MAX_PARAMETERS properties,
    each of a kind(), at least one of them a required string (free or an enum: what the model's
    call writes)."""
    p = parameters or {}
    props = p.get("properties") or {}
    required = p.get("required") or []
    if p.get("type") != "object" or not 1 <= len(props) <= MAX_PARAMETERS or not set(required) <= set(props):
        return False
    kinds = {k: kind(v) for k, v in props.items()}
    return None not in kinds.values() and any(kinds[k] in ("enum", "string") for k in required)


@dataclass(frozen=True)
class Binding:
    """A function's arguments as a question gives them: `values` the parameters filled here,
    `key` the one the model writes (a text, among `choices`), `missing` why it cannot be called
    for this question (empty: it can)."""

    values: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    choices: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    def arguments(self, written: str, order: Iterable[str]) -> dict[str, Any]:
        """The call's arguments, in the schema's `order`: the values filled here, and `written`
        (what the model wrote) for the key."""
        given = {**self.values, **({self.key: written} if self.key is not None else {})}
        return {k: given[k] for k in order if k in given}


def bind(parameters: dict[str, Any], question: str) -> Binding:
    """The arguments `question` gives a function whose parameters fit() (see the module)."""
    props: dict[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    kinds = {k: kind(v) for k, v in props.items()}
    values: dict[str, Any] = {}
    missing: list[str] = []
    taken: list[str] = []  # the enum values found: no free string's name too
    for name, prop in props.items():
        if kinds[name] == "enum":
            said = [v for v in prop["enum"] if written(question, v)]
            if len(said) == 1:
                values[name] = said[0]
                taken.append(said[0])
            elif said:
                missing.append(f"{name}: the question writes {len(said)} of its values ({', '.join(map(repr, said))})")
            elif name in required:
                missing.append(f"{name}: the question writes none of its values ({', '.join(map(repr, prop['enum']))})")
    missing += _numbers(props, kinds, required, question, values)
    for name in props:
        if kinds[name] == "boolean":
            said_b = _boolean(name, question)
            if said_b is not None:
                values[name] = said_b
            elif name in required:
                missing.append(f"{name}: the question does not write {name} true or false")
    key, choices, why = _texts(props, kinds, required, question, taken, values)
    missing += why
    if key is None and not missing:  # no free string to write: the model writes a required enum's value, if any
        key = next((k for k in props if k in required and kinds[k] == "enum"), None)
        choices = (values.pop(key),) if key is not None else ()
    return Binding(values, key if not missing else None, choices if not missing else (), tuple(missing))


def written(question: str, value: str) -> bool:
    """Does the question write an enum's value: whole, in any case ("Celsius" for "celsius"); a
    value of one letter only as a capital standing alone ("°F", "in C"), never "A" or "I",
    which a sentence writes as words."""
    if len(value) == 1:
        return value.isalpha() and value.upper() not in ("A", "I") and holds(question, value.upper())
    return bool(value.strip()) and holds(question.casefold(), value.casefold())


def _words(question: str) -> list[tuple[int, str]]:
    """The question's words, each without the sentence's punctuation around it, split at = and :
    ("days=3" is two), with where each starts."""
    out: list[tuple[int, str]] = []
    for m in _WORD.finditer(question):
        at = m.start()
        for part in _SPLIT.split(m[0]):
            out.append((at, part.strip("?.,!;\"'()")))
            at += len(part) + 1
    return out


def _name_words(name: str) -> set[str]:
    """A parameter's name as words a question may write beside its value: "num_days" -> {"num",
    "days"}, "maxResults" -> {"max", "results"}; each of three letters or more, singular."""
    parts = re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", name)
    return {p.lower().removesuffix("s") for p in parts if len(p) >= 3}


def _numbers(props: dict[str, Any], kinds: dict[str, str | None], required: set[str], question: str,
             values: dict[str, Any]) -> list[str]:
    """Fill the numeric parameters (into `values`): the number the question writes as a number
    next to a word of the parameter's name ("in 3 days", "limit 5"), and only that (a number
    beside no such word is told to be no parameter's); why not, for each required one."""
    words = _words(question)
    numbers = [i for i, (_, w) in enumerate(words) if NUMBER.fullmatch(w.lstrip("-"))]
    missing: list[str] = []
    for name in (k for k in props if kinds[k] in ("integer", "number")):
        cue = _name_words(name)
        beside = sorted({words[i][1] for i in numbers for j in (i - 1, i + 1)
                         if 0 <= j < len(words) and words[j][1].lower().removesuffix("s") in cue})
        if len(beside) > 1:
            missing.append(f"{name}: the question writes {len(beside)} numbers for it ({', '.join(beside)})")
            continue
        if not beside:
            if name in required:
                missing.append(f"{name}: the question writes no number beside its name")
            continue
        [text] = beside
        if kinds[name] == "integer" and "." in text:
            missing.append(f"{name}: the question's {text} is no integer")
            continue
        value: int | float = int(text) if "." not in text else float(text)
        if not schemas.validator(props[name]).is_valid(value):
            missing.append(f"{name}: the question's {text} does not fit its schema")
            continue
        values[name] = value
    return missing


def _boolean(name: str, question: str) -> bool | None:
    """true or false where the question writes it right after the parameter's name (its
    underscores as spaces or not): "include_alerts=true", "include alerts: false"."""
    for spelled in {name, name.replace("_", " ")}:
        m = re.search(rf"(?<![\w]){re.escape(spelled)}\s*[=:]?\s*(true|false)(?![\w])", question, re.IGNORECASE)
        if m:
            return _BOOLEAN[m[1].lower()]
    return None


def _texts(props: dict[str, Any], kinds: dict[str, str | None], required: set[str], question: str,
           taken: list[str], values: dict[str, Any]) -> tuple[str | None, tuple[str, ...], list[str]]:
    """The required free strings: every way to give each a different name of the question that
    fits its schema is found; each must have the same name in every way (filled into `values`,
    but the key, the first: what the model writes); one that varies cannot be told.  An
    optional one is filled only where its `pattern` fits one name of the question's (a date, a
    code), else left out.  (key, choices, why not)."""
    names = candidates(question, [*taken, *map(str, values.values())])
    for k in props:
        if kinds[k] == "string" and k not in required and "pattern" in props[k]:
            if len(fitting := [n for n in names if _fits(props[k], n)]) == 1:
                values[k] = fitting[0]
                names.remove(fitting[0])
    free = [k for k in props if kinds[k] == "string" and k in required]
    if not free:
        return None, (), []
    fit = {k: [n for n in names if _fits(props[k], n)] for k in free}
    if math.prod(len(fit[k]) for k in free) > MAX_WAYS:  # a question of many names: bounded before any work
        return None, (), [f"{', '.join(free)}: the question writes too many names that fit them to tell"]
    ways = [dict(zip(free, w, strict=True)) for w in itertools.product(*(fit[k] for k in free)) if len(set(w)) == len(w)]
    if not ways:
        bare = [k for k in free if not fit[k]]
        return None, (), ([f"{k}: the question writes no name that fits it" for k in bare] if bare else
                          [f"{', '.join(free)}: the question writes fewer names that fit them than they are"])
    varies = [k for k in free if len({w[k] for w in ways}) > 1]
    if len(varies) > 1:
        return None, (), [f"{', '.join(varies)}: the question's names cannot be told apart for them"]
    key = varies[0] if varies else free[0]
    choices = tuple(dict.fromkeys(w[key] for w in ways))
    if len(choices) > 1:  # the model would guess which: a call about another name is a wrong success
        return None, (), [f"{key}: the question writes {len(choices)} names that fit it "
                          f"({', '.join(map(repr, choices))}): which one cannot be told"]
    values.update({k: ways[0][k] for k in free if k != key})
    return key, choices, []


def candidates(question: str, given: Iterable[str]) -> list[str]:
    """The names a free string may take: those the question writes (question_names) but a bare
    number (a number is a numeric parameter's, or none's) and any that holds a value given to
    another parameter, or an = or : (a parameter named beside its value, "days=5"); none where
    the question asks arithmetic (asks_arithmetic: a calculator's expression)."""
    if asks_arithmetic(question):
        return []
    given = [g for g in given if g]
    return [n for n in question_names(question) if not NUMBER.fullmatch(n.lstrip("-")) and not _SPLIT.search(n)
            and not any(holds(n.casefold(), g.casefold()) for g in given)]


def _fits(prop: dict[str, Any], name: str) -> bool:
    """The name fits the parameter's own schema (its pattern, format, length)."""
    try:
        return bool(schemas.validator(prop).is_valid(name))
    except Exception:  # noqa: BLE001 - a reference the property alone cannot resolve: not told so
        return True
