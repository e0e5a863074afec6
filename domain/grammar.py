"""The API's grammar of a payload: what a name and a number may be, as a dashboard sends them, and
how the runtime writes them (canonical, clean_name, number_text); valid() says why a payload is
outside it.  runtime/jobs/specs.py takes payloads by it; domain/draws.py wild_payload draws from it.
The model never reads a name or a number of a payload (they enter as slots, domain/facts.py), so
the grammar is what a dashboard sends, not what a small model can copy."""

from __future__ import annotations

import math
import re
import string
import unicodedata
from decimal import Decimal

from domain.payload import Payload

NAME_FIRST = string.ascii_letters + string.digits
NAME_REST = NAME_FIRST + " .&'/-"
UNIT_CHARS = string.ascii_letters + "%$/"


_SPACES = re.compile(" {2,}")


def canonical(name: str) -> str:
    """A name as the runtime uses it: the spaces at its ends dropped and each run of spaces inside
    made one.  The API accepts "North  America " (a name copied from a spreadsheet often has
    them) and writes, checks and looks up "North America": a space at the end of a name is
    invisible in a narrative, and two names that differ only so are one to a reader."""
    return _SPACES.sub(" ", name).strip(" ")  # only U+0020: other whitespace is another character


MAX_NAME = 80  # characters of a name: a tenant, a metric, a unit, a period, a breakdown row
MAX_METRICS, MAX_ROWS = 8, 12
MAX_DIGITS, MAX_DECIMALS = 15, 6  # significant digits of a number (a double holds 15 exactly), decimals
_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
# a number written with thousands separators: one kind of mark between groups of three digits
# ("1,240", "1 240", "1.240.567"), then decimals after the other mark ("1,240.5", "1.240,5")
_SEPARATED = re.compile(r"(-?)([0-9]{1,3}([,' \u00a0\u202f.])[0-9]{3}(?:\3[0-9]{3})*)(?:(?!\3)[.,]([0-9]+))?")
# the format characters a word of some scripts holds: ZWNJ (Persian, Indic scripts), ZWJ (Indic
# conjuncts, emoji sequences); every other one (a bidi override, a soft hyphen) is refused
_JOINERS = frozenset("\u200c\u200d")


def name_problem(name: str) -> str | None:
    """Why `name` is no name (None: it is one): any text of 1-MAX_NAME characters in NFC (a name
    sent decomposed is composed first, see clean_name), no control character, no line break."""
    if not 1 <= len(name) <= MAX_NAME:
        return f"a name is 1-{MAX_NAME} characters, got {len(name)}"
    if name.isascii() and name.isprintable():  # the common case, at once: printable ASCII is no control
        return None
    bad = sorted({f"U+{ord(ch):04X}" for ch in name if ch not in _JOINERS and unicodedata.category(ch) in (
        "Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")})
    if bad:
        return f"a name holds no control or unassigned characters, got {', '.join(bad)} in {name!r}"
    return None


def clean_name(name: str) -> str:
    """A name as the runtime writes, checks and looks it up: NFC, then canonical (spaces)."""
    return canonical(unicodedata.normalize("NFC", name))


def number_text(x: str | int | float) -> str:
    """A payload number as the runtime writes it, from a JSON number or a string; ValueError that
    says how to write it.  Negative allowed; at most MAX_DIGITS significant digits and
    MAX_DECIMALS decimals; the decimals as given ("2.50" stays "2.50": the data's own rounding);
    a JSON number as Python reads it (1020.5; 1e3 is 1000.0, written "1000.0"), at most MAX_DIGITS
    significant digits of it where it has more: a double holds 15 exactly, what lies past them is
    binary noise where it lies within 4 units in the last place of such a number (0.1 + 0.2 is
    0.30000000000000004, taken as 0.3, as JavaScript sends it; 123456789012345.67 is refused)."""
    if isinstance(x, bool) or not isinstance(x, (str, int, float)):
        raise ValueError(f"a number is a JSON number or a string like \"-1240.5\", got {x!r}")
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            raise ValueError(f"a number is finite, got {x!r}")
        exact = Decimal(repr(x))
        if len(exact.as_tuple().digits) > MAX_DIGITS:
            near = Decimal(f"{x:.{MAX_DIGITS}g}")
            if abs(float(near) - x) <= 4 * math.ulp(x):  # a few units in the last place: noise, not data
                exact = near.normalize()
        text = format(exact, "f")
    else:
        text = str(x)
    if not _NUMBER_TEXT.fullmatch(text):
        sep = _SEPARATED.fullmatch(text.strip()) if isinstance(x, str) else None
        if sep is not None:  # "1.240" is no such number: it is 1.24 written with three decimals
            like = sep[1] + re.sub(r"[^0-9]", "", sep[2]) + (f".{sep[4]}" if sep[4] else "")
            raise ValueError(f"{x!r} has a thousands separator: write it without one, with a point for decimals, "
                             f"like {like}")
        if isinstance(x, str) and x != x.strip() and _NUMBER_TEXT.fullmatch(x.strip()):  # " 1240 "
            raise ValueError(f"{x!r} has spaces around it: write the number alone, like {x.strip()}")
        if isinstance(x, str) and _NUMBER_TEXT.fullmatch(x.strip().replace(",", ".", 1)):  # "2,5": a decimal comma
            raise ValueError(f"{x!r} has a decimal comma: write the decimals after a point, like "
                             f"{x.strip().replace(',', '.', 1)}")
        raise ValueError(f"a number is digits with an optional leading '-' and decimal point, like -1240.5, got {x!r}")
    whole, _, decimals = text.lstrip("-").partition(".")
    digits = (whole + decimals).lstrip("0") or "0"
    if len(decimals) > MAX_DECIMALS:
        raise ValueError(f"a number has at most {MAX_DECIMALS} decimals, got {len(decimals)} in {x!r}: round it")
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"a number has at most {MAX_DIGITS} significant digits, got {len(digits)} in {x!r}")
    return "0" + text[2:] if text.startswith("-0") and Decimal(text) == 0 else text  # -0 is 0


def valid(p: Payload) -> str | None:
    """Why p is outside the API's grammar (None: inside): what runtime/jobs/specs.py accepts."""
    names = [("tenant", p.tenant), ("period", p.period),
             *[(w, x) for m in p.metrics if m.custom for w, x in (("metric", m.key), ("unit", m.unit))],
             *[("row", r[0]) for r in (p.breakdown.rows if p.breakdown else [])]]
    for what, text in names:
        why = name_problem(text)
        if why is not None or text != clean_name(text):
            return f"{what} {text!r}: {why or 'not canonical'}"
    numbers = [x for m in p.metrics for x in (m.value, m.prev, m.target) if x is not None]
    numbers += [x for r in (p.breakdown.rows if p.breakdown else []) for x in r[1:]]
    for x in numbers:
        try:
            if number_text(x) != x:
                return f"number {x!r} is not as the runtime writes it"
        except ValueError as e:
            return str(e)
    if not 1 <= len(p.metrics) <= MAX_METRICS or (p.breakdown is not None and not 1 <= len(p.breakdown.rows) <= MAX_ROWS):
        return f"1-{MAX_METRICS} metrics, a breakdown of 1-{MAX_ROWS} rows"
    return None
