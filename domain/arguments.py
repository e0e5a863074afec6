"""A client's function of several parameters, its arguments taken from the question by
construction (`get_weather(city, unit)`, `get_forecast(city, days)`): the model writes one of
them, a text (the calculator's call shape, `calc("Paris")`: the one call of one text it was
trained to write), guided whole to the one name the question gives it; the runtime fills each
other parameter from what the question writes for it, and nothing else:

- an `enum`'s value the question writes whole (any case; a value of one letter only as a
  capital standing alone, "°F", "in C", never the words "a" and "I");
- a number (integer or number) the question writes as a number next to a word of the
  parameter's name ("in 3 days": `days`; "limit 5"; "level of 7"); a parameter whose name says
  no more than "a number" (GENERIC: `n`, `value`, `level`) takes it from its function's name
  too: the ordinal before it ("the 10th Fibonacci number": `get_fibonacci(n)`) or the number
  after it ("the volume to 7": `set_volume(level)`), never a count of it ("2 flights"), and
  only in a question that writes no other number;
- a boolean where the question writes the parameter's name then true or false ("alerts=true"),
  or, for a parameter of a switch's state (SWITCHES: `on`, `enabled`), where it asks to turn or
  switch it on or off, to enable or disable ("Turn the lights on"), with no negation;
- a free string the one name the question writes (`candidates`) that fits the parameter's own
  schema; two or more free strings are told apart only where their schemas leave each one name
  (a `pattern`, a length); an optional one is filled only where its `pattern` fits one name;
- an array of enum values the values the question writes, in its order; an array of free
  strings (no other free string beside it) or of numbers the names, or the numbers no other
  parameter takes, where they make one list ("Paris, Rome and Berlin"; LIST: commas, "and").

The model writes one of them, as a text: a free string, else an enum's value, else the text of
another required value ("10", "true", "Paris, Rome"), read back as that value (`typed`).

A required parameter the question gives no value for, or two values for (two names that fit a
free string: which it means cannot be told, and the model's guess would be a call about the
other), is why the function is not called (`Binding.missing`), never a value made up.  An
optional one it gives none for is left out.  An object or an array of anything else is not filled
(fits: the function is not called).  Pure: no torch, no decoding."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from domain import schemas
from domain.answers import asks_arithmetic
from domain.tools import MAX_NAME, NUMBER, holds, question_names

MAX_PARAMETERS = 4  # a function's parameters that can be filled so (issue 52: 1 to 4)
MAX_WAYS = 4096  # ways to give the free strings names that are tried, at most (4 of 8 names each)
_BOOLEAN = {"true": True, "false": False}
_WORD = re.compile(r"[^\s]+")
_SPLIT = re.compile(r"[=:]")
_ORDINAL = re.compile(r"([0-9]+)(?:st|nd|rd|th)", re.IGNORECASE)  # "10th": the 10
_SCALARS = ("enum", "string", "integer", "number")  # what an array's items may be, to be filled
#: parameter names that say no more than "a number": such a parameter takes its number from
#: its function's name too ("the 10th Fibonacci number" for `get_fibonacci(n)`)
GENERIC = frozenset({"n", "x", "k", "i", "num", "number", "value", "val", "index", "idx", "position", "nth",
                     "level", "amount"})
#: words of a function's name that say what it does, not what its number counts
_VERBS = frozenset({"get", "set", "fetch", "find", "list", "show", "compute", "calculate", "calc", "make", "create",
                    "lookup", "look", "run", "do", "put", "change", "update", "adjust", "the", "for", "and", "with",
                    "from", "by", "of", "to"})
_TO = frozenset({"to", "at", "of", "is"})  # a word between a name and its number: "the volume to 7", "level of 3"
_UPDOWN = frozenset({"up", "down"})  # "the volume up to 7" (but "up 3", "up by 3": a change, not a value)
#: a switch's state: a boolean parameter whose name holds one is said on or off (_boolean)
SWITCHES = frozenset({"on", "enabled", "enable", "active", "activated", "power", "powered", "state", "status"})
_SWITCH_VERBS = frozenset({"turn", "switch", "power", "flip", "put", "set"})  # "turn ... on", "switch ... off"
_SWITCHED = {"on": True, "off": False}  # after a verb of _SWITCH_VERBS in the sentence
_ENABLED = {"enable": True, "enabled": True, "activate": True, "activated": True,
            "disable": False, "disabled": False, "deactivate": False, "deactivated": False}
_NEGATION = frozenset({"not", "don't", "dont", "never", "no", "doesn't", "isn't", "won't", "can't", "cannot", "nor",
                       "without", "shouldn't", "mustn't"})
#: verbs a request opens with, capitalised before a name ("Compare Paris and Rome"): no part of it
OPENERS = frozenset({"compare", "show", "list", "get", "find", "tell", "give", "check", "look", "fetch", "plot",
                     "sum", "add", "average", "rank", "sort", "convert", "translate", "book", "search", "describe",
                     "summarize", "summarise", "email", "call", "text", "message", "remind", "send", "visit", "ping",
                     "greet", "invite", "notify", "weather", "forecast", "quote", "price"})
#: what may stand between two items of one list the question writes ("Paris, Rome and Berlin")
LIST = frozenset({",", "and", ", and", "&", "vs", "vs.", "versus"})


def kind(prop: Any) -> str | None:
    """What a parameter's schema asks, as filled here: "enum" (strings), "string", "integer",
    "number", "boolean", "array" (of items of one of _SCALARS); None: anything else (an object,
    an array of objects, a union), never filled."""
    if not isinstance(prop, dict):
        return None
    if prop.get("type") == "array":
        return "array" if kind(prop.get("items")) in _SCALARS else None
    if "enum" in prop:
        values = prop["enum"]
        ok = isinstance(values, list) and values and all(isinstance(v, str) for v in values)
        return "enum" if ok and prop.get("type", "string") == "string" else None
    t = prop.get("type")
    return t if t in ("string", "integer", "number", "boolean") else None


def fits(parameters: dict[str, Any] | None) -> bool:
    """A function whose arguments can be filled so: an object of 1 to MAX_PARAMETERS properties,
    each of a kind(), at least one of them required (what the model's call writes: a free
    string, an enum's value, or the text of another value)."""
    p = parameters or {}
    props = p.get("properties") or {}
    required = p.get("required") or []
    if p.get("type") != "object" or not 1 <= len(props) <= MAX_PARAMETERS or not set(required) <= set(props):
        return False
    return None not in {kind(v) for v in props.values()} and bool(required)


@dataclass(frozen=True)
class Binding:
    """A function's arguments as a question gives them: `values` the parameters filled here,
    `key` the one the model writes (a text, among `choices`; `typed`: the value a choice stands
    for where the key is no string), `missing` why it cannot be called for this question (empty:
    it can)."""

    values: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    choices: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    typed: dict[str, Any] = field(default_factory=dict)

    def arguments(self, written: str, order: Iterable[str]) -> dict[str, Any]:
        """The call's arguments, in the schema's `order`: the values filled here, and `written`
        (what the model wrote, as the value it stands for) for the key."""
        given = {**self.values, **({self.key: self.typed.get(written, written)} if self.key is not None else {})}
        return {k: given[k] for k in order if k in given}


def bind(parameters: dict[str, Any], question: str, function: str = "") -> Binding:
    """The arguments `question` gives a function (named `function`) whose parameters fit() (see
    the module)."""
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
        elif kinds[name] == "array" and kind(prop["items"]) == "enum":
            said = sorted((v for v in prop["items"]["enum"] if written(question, v)), key=lambda v: _at(question, v))
            taken += said
            missing += _fill(name, prop, said, name in required, values)
    missing += _numbers(props, kinds, required, question, values, function)
    for name in props:
        if kinds[name] == "boolean":
            said_b = _boolean(name, question)
            if isinstance(said_b, bool):
                values[name] = said_b
            elif name in required or said_b:
                missing.append(f"{name}: {said_b or f'the question does not write {name} true or false'}")
    key, choices, why = _texts(props, kinds, required, question, taken, values)
    missing += why
    typed: dict[str, Any] = {}
    if key is None and not missing:  # no free string to write: the model writes a required enum's value, if any
        key = next((k for k in props if k in required and kinds[k] == "enum"), None)
        choices = (values.pop(key),) if key is not None else ()
    if key is None and not missing:  # else the text of another required value, read back as that value
        key = next((k for k in props if k in required and k in values), None)
        if key is not None:
            typed = {_text(values[key]): values.pop(key)}
            choices = tuple(typed)
            if len(choices[0]) > MAX_NAME or '"' in choices[0]:
                missing.append(f"{key}: its value is too long to write as one text ({len(choices[0])} characters)")
    if missing:
        return Binding(values, None, (), tuple(missing))
    return Binding(values, key, choices, (), typed)


def written(question: str, value: str) -> bool:
    """Does the question write an enum's value: whole, in any case ("Celsius" for "celsius"); a
    value of one letter only as a capital standing alone ("°F", "in C"), never "A" or "I",
    which a sentence writes as words."""
    if len(value) == 1:
        return value.isalpha() and value.upper() not in ("A", "I") and holds(question, value.upper())
    return bool(value.strip()) and holds(question.casefold(), value.casefold())


def _at(question: str, value: str) -> int:
    """Where the question first writes an enum's value (as written() finds it)."""
    return question.find(value.upper()) if len(value) == 1 else question.casefold().find(value.casefold())


def _text(value: Any) -> str:
    """A value as the model writes it: 10, 2.5, true, "Paris, Rome" (an array's items, LIST's comma)."""
    if isinstance(value, list):
        return ", ".join(map(_text, value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _fill(name: str, prop: dict[str, Any], items: list[Any], needed: bool, values: dict[str, Any]) -> list[str]:
    """Fill an array (into `values`) with the items the question gives it, where they fit its
    schema; why not, where it is required or the items do not fit."""
    if not items:
        return [f"{name}: the question writes no list for it"] if needed else []
    if not schemas.validator(prop).is_valid(items):
        return [f"{name}: the question's list ({_text(items)}) does not fit its schema"]
    values[name] = items
    return []


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


def _cued(words: list[str], i: int, ordinal: bool, cue: set[str], named: set[str]) -> bool:
    """Is the question's number at word i the parameter's: next to a word of its name (`cue`),
    or after one and a word of _TO ("level of 7"); a cardinal only (an ordinal is no amount).
    `named`: its function's name's words, where its own name says no more than a number
    (GENERIC): the ordinal before one ("the 10th Fibonacci"), the number after one ("volume 7",
    "volume to 7", "volume up to 7")."""
    def w(j: int) -> str:  # a word, lower case
        return words[j] if 0 <= j < len(words) else ""

    def of(j: int, cues: set[str]) -> bool:  # a word of `cues` (singular)
        return w(j).removesuffix("s") in cues

    def after(cues: set[str]) -> bool:
        return of(i - 1, cues) or (w(i - 1) in _TO and (of(i - 2, cues) or (w(i - 2) in _UPDOWN and of(i - 3, cues))))

    if not ordinal and (of(i + 1, cue) or after(cue)):
        return True
    return bool(named) and (of(i + 1, named) if ordinal else after(named))


def _numbers(props: dict[str, Any], kinds: dict[str, str | None], required: set[str], question: str,
             values: dict[str, Any], function: str = "") -> list[str]:
    """Fill the numeric parameters (into `values`): the number the question writes for each
    (_cued), and only that (a number beside no such word is told to be no parameter's); an
    array of numbers, those no other takes, where they make one list; why not, for each
    required one."""
    spans = _words(question)
    words = [w.lower() for _, w in spans]
    found: dict[int, tuple[str, bool]] = {}  # word index -> (the number's text, an ordinal)
    for i, (_, w) in enumerate(spans):
        if NUMBER.fullmatch(w.lstrip("-")):
            found[i] = (w, False)
        elif m := _ORDINAL.fullmatch(w):
            found[i] = (m[1], True)
    scalars = [k for k in props if kinds[k] in ("integer", "number")]
    named = _name_words(function) - _VERBS
    missing: list[str] = []
    claimed: set[int] = set()
    for name in scalars:
        cue = _name_words(name)
        generic = named if (name.lower() in GENERIC or not cue) and len(scalars) == 1 else set()
        at = [i for i, (_, o) in found.items() if _cued(words, i, o, cue, set())]
        if not at and generic and (at := [i for i, (_, o) in found.items() if _cued(words, i, o, set(), generic)]):
            if others := [found[i][0] for i in found if i not in at]:  # "the sum of the 3rd and 10th Fibonacci"
                missing.append(f"{name}: the question writes numbers other than its own ({', '.join(others)}): "
                               "what it asks of them cannot be told")
                continue
        claimed.update(at)
        beside = sorted({found[i][0] for i in at})
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
        value = _number(text)
        if not schemas.validator(props[name]).is_valid(value):
            missing.append(f"{name}: the question's {text} does not fit its schema")
            continue
        values[name] = value
    for name in (k for k in props if kinds[k] == "array" and kind(props[k]["items"]) in ("integer", "number")):
        left = [i for i, (_, o) in sorted(found.items()) if i not in claimed and not o]
        if not _one_list(question, [(spans[i][0], found[i][0]) for i in left]):
            missing.append(f"{name}: the question's numbers ({', '.join(found[i][0] for i in left)}) make no one list")
            continue
        missing += _fill(name, props[name], [_number(found[i][0]) for i in left], name in required, values)
    return missing


def _number(text: str) -> int | float:
    return int(text) if "." not in text else float(text)


def _one_list(question: str, items: list[tuple[int, str]]) -> bool:
    """Do the items (where the question writes each from, its text) make one list: between each
    and the next only a word of LIST ("Paris, Rome and Berlin"; "3, 7 and 12")."""
    spans: list[tuple[int, int]] = []
    for at, text in items:
        i = question.find(text, at)
        if i < 0:
            return False
        spans.append((i, i + len(text)))
    return all(" ".join(question[a[1]:b[0]].split()).casefold() in LIST for a, b in itertools.pairwise(spans))


def _boolean(name: str, question: str) -> bool | str | None:
    """true or false where the question writes it right after the parameter's name (its
    underscores as spaces or not): "include_alerts=true", "include alerts: false"; for a
    switch's state (SWITCHES), what it asks the switch to be ("Turn the lights on", "Disable
    alerts"); why it cannot be told (a str: two ways asked, or a negation); None: not said."""
    for spelled in {name, name.replace("_", " ")}:
        m = re.search(rf"(?<![\w]){re.escape(spelled)}\s*[=:]?\s*(true|false)(?![\w])", question, re.IGNORECASE)
        if m:
            return _BOOLEAN[m[1].lower()]
    if not set(re.split(r"[_\W]+", name.lower())) & SWITCHES:
        return None
    said: set[bool] = set()
    for sentence in re.split(r"[.!?;]+", question.lower()):
        words = [w.strip(",:\"'()") for w in sentence.split()]
        if set(words) & _NEGATION:
            return f"the question says not to: {name} cannot be told"
        verb = next((i for i, w in enumerate(words) if w in _SWITCH_VERBS), None)
        said |= {_SWITCHED[w] for w in words[verb + 1:] if w in _SWITCHED} if verb is not None else set()
        said |= {_ENABLED[w] for w in words if w in _ENABLED}
    if len(said) > 1:
        return f"the question asks {name} both true and false"
    return said.pop() if said else None


def _texts(props: dict[str, Any], kinds: dict[str, str | None], required: set[str], question: str,
           taken: list[str], values: dict[str, Any]) -> tuple[str | None, tuple[str, ...], list[str]]:
    """The required free strings: every way to give each a different name of the question that
    fits its schema is found; each must have the same name in every way (filled into `values`,
    but the key, the first: what the model writes); one that varies cannot be told.  An
    optional one is filled only where its `pattern` fits one name of the question's (a date, a
    code), else left out.  (key, choices, why not)."""
    names = candidates(question, [*taken, *(_text(v) for v in values.values() if not isinstance(v, list))])
    for k in props:
        if kinds[k] == "string" and k not in required and "pattern" in props[k]:
            if len(fitting := [n for n in names if _fits(props[k], n)]) == 1:
                values[k] = fitting[0]
                names.remove(fitting[0])
    free = [k for k in props if kinds[k] == "string" and k in required]
    lists = [k for k in props if kinds[k] == "array" and kind(props[k]["items"]) == "string"
             and (k in required or not free)]  # an optional one beside a free string: left out
    if lists:
        if free or len(lists) > 1:
            return None, (), [f"{', '.join([*free, *lists])}: the question's names cannot be told apart for them"]
        [k] = lists
        items = [n for n in names if _fits(props[k]["items"], n)]
        if not _one_list(question, _placed(question, items)):
            return None, (), [f"{k}: the question's names ({', '.join(map(repr, items))}) make no one list"]
        return None, (), _fill(k, props[k], items, k in required, values)
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


def _placed(question: str, names: list[str]) -> list[tuple[int, str]]:
    """Each name with where the question writes it, after the one before (question_names' order)."""
    out, at = [], 0
    for n in names:
        at = max(question.find(n, at), 0)
        out.append((at, n))
        at += len(n)
    return out


def candidates(question: str, given: Iterable[str]) -> list[str]:
    """The names a free string may take: those the question writes (question_names) but a bare
    number or ordinal (a numeric parameter's, or none's) and any that holds a value given to
    another parameter, or an = or : (a parameter named beside its value, "days=5"), each without
    a verb of OPENERS it opens with ("Compare Paris" is "Paris"); none where the question asks
    arithmetic (asks_arithmetic: a calculator's expression)."""
    if asks_arithmetic(question):
        return []
    given = [g for g in given if g]
    named = [n.split(" ", 1)[1] if " " in n and n.split(" ", 1)[0].lower() in OPENERS else n for n in question_names(question)]
    return [n for n in named if not NUMBER.fullmatch(n.lstrip("-")) and not _ORDINAL.fullmatch(n)
            and not _SPLIT.search(n)
            and not any(holds(n.casefold(), g.casefold()) for g in given)]


def _fits(prop: dict[str, Any], name: str) -> bool:
    """The name fits the parameter's own schema (its pattern, format, length)."""
    try:
        return bool(schemas.validator(prop).is_valid(name))
    except Exception:  # noqa: BLE001 - a reference the property alone cannot resolve: not told so
        return True
