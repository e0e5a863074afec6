"""The agent's tools, as the model calls them and the runtime runs them: the call syntax
(`<call>metric("churn", "EMEA", "2026-Q3")</call>`, then `<result>2.5</result>`), the calculator,
the metric stores (the sample Dataset, a tenant's Store) and the error results a failed call gets
back.  Generated transcripts (domain/agent.py) and the runtime's tools (workflows/tools.py) both
run these, so they cannot disagree.  Knows nothing of decoding or of how an answer is checked."""

from __future__ import annotations

import ast
import difflib
import operator
import random
import re
import warnings
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext

from domain.markup import SPECIAL_TOKENS
from domain.payload import METRIC, PERIODS, REGIONS

CALL, END_CALL, RESULT, END_RESULT = "<call>", "</call>", "<result>", "</result>"


class ToolError(ValueError):
    """A tool call the tools cannot run; its message goes back to the model as the result."""


# ---- the tools' semantics -----------------------------------------------------------------


MAX_DECIMALS, MAX_INT_DIGITS = 6, 15  #: what a result writes at most (RESULT_RE)


def format_number(x: Decimal | str) -> str:
    """A result as the tools write it: exact where it has at most MAX_DECIMALS decimals
    (0.0034-0.0019 -> 0.0015, 1.005+1 -> 2.005, 250.0 -> 250); else (a quotient that does not
    end, a product of long decimals) rounded half up to 2 decimals (26.3157... -> 26.32), or,
    below 1, to 2 significant digits (1/300 -> 0.0033), never to a 0 it is not: a result is
    a number the answer states, so it must not say 0.0015 is 0.  ToolError where it cannot be
    written so (below 0.000001, or more than MAX_INT_DIGITS digits before the point)."""
    with localcontext() as ctx:
        ctx.prec = 80  # every operand and result of a calc is exact in it but a quotient
        d = Decimal(x)
        if abs(d) >= 10 ** MAX_INT_DIGITS:
            raise ToolError(f"the result has more than {MAX_INT_DIGITS} digits before the point")
        if d == d.quantize(Decimal(1).scaleb(-MAX_DECIMALS)):
            r = d
        elif abs(d) >= 1:
            r = d.quantize(Decimal("0.01"), ROUND_HALF_UP)
        else:
            r = d.quantize(Decimal(1).scaleb(-min(MAX_DECIMALS, 1 - d.adjusted())), ROUND_HALF_UP)
            if r == 0:
                raise ToolError(f"the result is not 0 but below 0.{'0' * (MAX_DECIMALS - 1)}1, the smallest a result writes")
    s = format(r, "f")
    s = s.rstrip("0").rstrip(".") if "." in s else s
    if len(s.lstrip("-").split(".")[0]) > MAX_INT_DIGITS:
        raise ToolError(f"the result has more than {MAX_INT_DIGITS} digits before the point")
    return "0" if s == "-0" else s


_BINOPS: dict[type, Callable[[Decimal, Decimal], Decimal]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_EXPR = 200
_CALC_CHARS = re.compile(r"[0-9. +\-*/()]+")


def calc(expr: str) -> str:
    """Evaluate + - * / and parentheses over decimal numbers (no names, no calls, no powers)."""
    if len(expr) > MAX_EXPR:
        raise ToolError(f"expression longer than {MAX_EXPR} characters")
    if not _CALC_CHARS.fullmatch(expr):  # decimal only: Python would also read 0x10, 1_0, 1e5
        raise ToolError(f"unsupported expression in {expr!r}: only numbers, + - * / and parentheses")
    try:
        with warnings.catch_warnings():  # "45orp": Python's SyntaxWarning on stderr; the error result says it
            warnings.simplefilter("error", SyntaxWarning)
            source = expr.strip()
            tree = ast.parse(source, mode="eval")
    except (SyntaxError, SyntaxWarning) as e:
        raise ToolError(f"cannot parse {expr!r}") from e

    def ev(n: ast.AST) -> Decimal:  # exact: a number as written (a float would make 1.005+1 2.0049999...)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return Decimal(ast.get_source_segment(source, n) or "")
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return _BINOPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        raise ToolError(f"unsupported expression in {expr!r}: only numbers, + - * / and parentheses")

    try:
        with localcontext() as ctx:
            ctx.prec = 80  # + - * of operands of 15 + 6 digits stay exact; a quotient is rounded by format_number
            value = ev(tree.body)
    except (ZeroDivisionError, InvalidOperation) as e:  # x/0; 0/0 is decimal's InvalidOperation
        raise ToolError("division by zero") from e
    return format_number(value)


@dataclass(frozen=True)
class Dataset:
    """The metric store the `metric` tool reads: every (metric, region, period) has a value,
    drawn deterministically from the seed."""

    seed: int

    def lookup(self, key: str, region: str, period: str) -> str:
        key = METRIC_KEYS.get(key, key)  # a metric as a question names it ("average order value")
        if key not in METRIC:
            raise ToolError(f"unknown metric {key!r}; known: {', '.join(METRIC)}")
        if region not in REGIONS:
            raise ToolError(f"unknown region {region!r}; known: {', '.join(REGIONS)}")
        if period not in PERIODS:
            raise ToolError(f"unknown period {period!r}")
        _, _, _, dec, (lo, hi) = METRIC[key]
        rng = random.Random(f"metric/{self.seed}/{key}/{region}/{period}")
        return f"{rng.uniform(lo, hi):.{dec}f}"


#: what a result may be, as the model reads it after `<result>`: a number as the tools write it
#: (format_number, Dataset.lookup) or an error line; a client's tool output is held to it
RESULT_RE = r"-?[0-9]{1,15}(?:\.[0-9]{1,6})?|error: [^<>\x00-\x1f]{1,200}"
MAX_REASON = 200  # an error result's reason, in characters (RESULT_RE's bound)
_NOT_IN_RESULT = re.compile(r"[<>\x00-\x1f]")


def error_result(reason: str) -> str:
    """"error: <reason>" held to RESULT_RE, as every result is, whichever tool failed (ours, or a
    client's raising): a reason often quotes what the model wrote, which may hold a marker's `<`
    (`<result>`), a control character, or a control token's text ([EOS] would encode to the token).
    Each `<`, `>` and control character becomes a space, a control token's brackets parentheses
    ("(EOS)"); a reason longer than MAX_REASON is cut, ending "...".
    'not a tool call: "<result>"' -> 'error: not a tool call: " result "'."""
    for special in SPECIAL_TOKENS:
        reason = reason.replace(special, f"({special[1:-1]})")
    text = _NOT_IN_RESULT.sub(" ", reason).strip() or "the tool failed and said nothing more"
    if len(text) > MAX_REASON:
        text = text[:MAX_REASON - 3].rstrip() + "..."
    return f"error: {text}"


def is_text(result: str) -> bool:
    """A result that is words, not a number nor an error line: a client's function's output
    ("64 degrees and clear"), which an answer can only quote whole (domain/answers.py)."""
    return not result.startswith("error:") and not _NUMBER_RESULT.fullmatch(result)


_NUMBER_RESULT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
#: what a question names, as a client's function of one text argument may take it: a fact slot
#: ([F3]), a quoted text, a word holding a digit, "@" or "_" (an email, an id, a code, a period),
#: or a run of capitalised words (a proper name) that is more than a sentence's first word
_SLOT_NAME = r"\[F[0-9]+\]"
_QUOTED = re.compile(r'"([^"\n]{1,64})"|\u201c([^\u201d\n]{1,64})\u201d')
_MARKED = re.compile(r"[^\s,;:!?()\"]*[0-9@_][^\s,;:!?()\"]*")
_PROPER = re.compile(r"(?<![\w'])[A-Z][\w'.&-]*(?: [A-Z][\w'.&-]*)*")
_OPENS = re.compile(r"(?:^|[.!?])\s*$")  # what comes before a sentence's first word
MAX_NAME = 64  # a name a call's argument copies, in characters (MetricArgs' bound)


def question_names(question: str) -> list[str]:
    """The names a question writes (_QUOTED, _MARKED, _PROPER), in the order it writes them, each
    at most MAX_NAME characters, none ending in the sentence's punctuation.  "Use the weather tool
    to get the temperature in San Francisco." -> ["San Francisco"] ("Use" only opens the
    sentence, as "Answer" does in "Is it cold in Oslo? Answer in C."); "Who is ann@example.com?"
    -> ["ann@example.com"]."""
    found: list[tuple[int, str]] = []
    for m in _QUOTED.finditer(question):
        found.append((m.start(1) if m[1] is not None else m.start(2), (m[1] or m[2]).strip()))
    for m in re.finditer(_SLOT_NAME, question):
        found.append((m.start(), m[0]))
    for m in _MARKED.finditer(question):
        found.append((m.start(), m[0].rstrip(".'-")))
    for m in _PROPER.finditer(question):
        name = m[0].rstrip(".'-")
        if (_OPENS.search(question[:m.start()]) and " " not in name) or name == "I":
            continue  # a sentence's first word, alone, or "I": no name
        found.append((m.start(), name))
    names, end = [], -1
    for i, n in sorted(found, key=lambda x: (x[0], -len(x[1]))):
        if i >= end and n and len(n) <= MAX_NAME and holds(question, n):  # none inside another ("Q3" of "2026-Q3")
            names.append(n)
            end = i + len(n)
    return list(dict.fromkeys(names))


def call_text(tool: str, *args: str) -> str:
    return f'{tool}({", ".join(chr(34) + a + chr(34) for a in args)})'


_CALL_RE = re.compile(r'^(metric|calc)\((.*)\)$', re.DOTALL)
ARG_RE = re.compile(r'"([^"]*)"')



_CALL_RE = re.compile(r'^(metric|calc)\((.*)\)$', re.DOTALL)
ARG_RE = re.compile(r'"([^"]*)"')
# NUMBER and DIGITS are answers.py's too: the guide and verify() read a call's numbers alike
NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
DIGITS = re.compile(r"[0-9.]+")  # a number of a calc expression, as far as it is written


def parse_call(text: str) -> tuple[str, list[str]]:
    """'metric("churn", "EMEA", "2026-Q3")' -> ("metric", ["churn", "EMEA", "2026-Q3"])."""
    m = _CALL_RE.match(text.strip())
    if not m:
        raise ToolError(f"not a tool call: {text!r}; expected metric(...) or calc(...)")
    args = ARG_RE.findall(m.group(2))
    want = 3 if m.group(1) == "metric" else 1
    if len(args) != want or ARG_RE.sub("", m.group(2)).replace(",", "").strip():
        raise ToolError(f"{m.group(1)} takes {want} quoted argument(s): {text!r}")
    return m.group(1), args


def run_call(text: str, data: Dataset | Store) -> str:
    """The tool result for one call's text; a ToolError's message when it cannot run."""
    try:
        tool, args = parse_call(text)
        return calc(args[0]) if tool == "calc" else data.lookup(*args)
    except ToolError as e:
        return error_result(str(e))


def metric_name(key: str) -> str:
    return METRIC[key][1].lower()


METRIC_KEYS = {metric_name(k): k for k in METRIC}  # a metric as a question names it -> its key
#: what the sample dataset holds by name, per field (a question's names the runtime makes slots)
SAMPLE_NAMES = (tuple(METRIC_KEYS), REGIONS, PERIODS)

FIELDS = ("metric", "region", "period")
HINT_CUTOFF = 0.5  # difflib's ratio a held name must reach to be offered for one it does not hold


def no_row(call: tuple[str, str, str], held: tuple[Collection[str], ...], question: str = "") -> ToolError:
    """The error for a (metric, region, period) a store holds no row for.  held: the names the
    store holds, per field; question: the one the call answers, if known.  A name held nowhere is
    named; where the question does not hold it either (a miscopy: "Xfgis 32" for the question's
    "Xfers 32"), with the closest name that both the store and the question hold, from which the
    model mends the call (trained so: slipped).  A name copied right but not held gets no hint: a
    hint would be another row, a wrong answer.  Held names that are no row together are "no row".
    ("dc", "Xfgis 32", "1993-H1") -> "unknown region 'Xfgis 32': did you mean 'Xfers 32'?"."""
    parts = []
    for field, name, names in zip(FIELDS, call, held, strict=True):
        if name not in names:
            asked = [n for n in names if holds(question, n)] if question and not holds(question, name) else []
            close = difflib.get_close_matches(name, asked, n=1, cutoff=HINT_CUTOFF)
            parts.append(f"unknown {field} {name!r}" + (f": did you mean {close[0]!r}?" if close else ""))
    if not parts:
        return ToolError(f"no row for metric {call[0]!r}, region {call[1]!r}, period {call[2]!r}")
    return ToolError("; ".join(parts))


def holds(text: str, name: str, whole: bool = True) -> bool:
    """Does text hold name whole (not "d" in "dc", "Z" in "Zürich"): no letter or digit on either
    side (whole=False: before it; name may go on).  str.find, not a regex: the guide asks this at
    every step."""
    i = text.find(name)
    while i >= 0:
        j = i + len(name)
        if (i == 0 or not text[i - 1].isalnum()) and (not whole or j == len(text) or not text[j].isalnum()):
            return True
        i = text.find(name, i + 1)
    return False


@dataclass(frozen=True)
class Store:
    """A metric store of any names (a tenant's own dataset, as the runtime's Table reads one):
    (metric, region, period) -> value; lookup as Dataset's, its errors no_row's."""

    values: dict[tuple[str, str, str], str]

    def lookup(self, key: str, region: str, period: str) -> str:
        try:
            return self.values[key, region, period]
        except KeyError:
            raise no_row((key, region, period), held_names(self.values)) from None


def held_names(keys: Iterable[tuple[str, str, str]]) -> tuple[set[str], ...]:
    """(metric, region, period) keys -> the names held per field."""
    held: tuple[set[str], ...] = (set(), set(), set())
    for k in keys:
        for names, name in zip(held, k, strict=True):
            names.add(name)
    return held
