"""Agent transcripts with tool calls: a question about metrics or arithmetic -> tool calls ->
a final answer that uses their results.  Deterministic by seed.

    Q: By how much did churn in EMEA change from 2026-Q2 to 2026-Q3, in percent?
    <call>metric("churn", "EMEA", "2026-Q2")</call><result>2.5</result>
    <call>metric("churn", "EMEA", "2026-Q3")</call><result>3.1</result>
    <call>calc("(3.1-2.5)/2.5*100")</call><result>24</result>
    A: Churn in EMEA changed by 24% from 2026-Q2 to 2026-Q3.

The model writes the calls and the answer; the runtime writes each `<result>...</result>` (in
training those tokens are given, not predicted).  Metric values come from a `Dataset`, a
deterministic function of (seed, metric, region, period): training draws a fresh dataset per
example, so the model learns to copy results rather than to memorise them.

The tools' semantics live here (`calc`, `format_number`, `Dataset`) so that generated results
and the runtime's tools cannot disagree; workflows/ wraps them for the agent loop.  How a
transcript and its answer are read back (`check` against a task, `verify` with none) is
domain/answers.py.
"""

from __future__ import annotations

import ast
import bisect
import difflib
import operator
import random
import re
import string
import warnings
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace

from domain import draws, grammar
from domain.facts import SLOT
from domain.markup import SPECIAL_TOKENS
from domain.payload import METRIC, METRICS, PERIODS, REGIONS

CALL, END_CALL, RESULT, END_RESULT = "<call>", "</call>", "<result>", "</result>"


class ToolError(ValueError):
    """A tool call the tools cannot run; its message goes back to the model as the result."""


# ---- the tools' semantics -----------------------------------------------------------------


def format_number(x: float) -> str:
    """Results are rounded to 2 decimals, trailing zeros dropped: 26.3158 -> 26.32, 250.0 -> 250."""
    s = f"{round(x, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


_BINOPS: dict[type, Callable[[float, float], float]] = {
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
            tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, SyntaxWarning) as e:
        raise ToolError(f"cannot parse {expr!r}") from e

    def ev(n: ast.AST) -> float:
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return float(n.value)
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return _BINOPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        raise ToolError(f"unsupported expression in {expr!r}: only numbers, + - * / and parentheses")

    try:
        return format_number(ev(tree.body))
    except ZeroDivisionError as e:
        raise ToolError("division by zero") from e


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


def call_text(tool: str, *args: str) -> str:
    return f'{tool}({", ".join(chr(34) + a + chr(34) for a in args)})'


_CALL_RE = re.compile(r'^(metric|calc)\((.*)\)$', re.DOTALL)
ARG_RE = re.compile(r'"([^"]*)"')


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


# ---- guided calls ------------------------------------------------------------------------

_METRIC, _CALC = 'metric("', 'calc("'  # a call's text up to its first argument
# NUMBER and DIGITS are answers.py's too: the guide and verify() read a call's numbers alike
NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
DIGITS = re.compile(r"[0-9.]+")  # a number of a calc expression, as far as it is written
_EXPR_CHARS = frozenset("0123456789.+-*/() ")


@dataclass(frozen=True)
class CallNames:
    """What a call may copy.  A metric call's arguments: a name the question holds whole (as in
    training), or one the source is known to hold, per field (the sample dataset's fixed lists;
    () for a tenant's table, whose rows may change during a job: the guide would too).  A calc
    expression's numbers: those of the question and of the results so far (after), and 100 (a
    percentage), as training writes them.  A guide keeps copies right; answers.verify() holds the
    calls to the question (a period's digits, or a 100 outside a percent change, copyable here,
    are no operand there)."""

    question: str
    held: tuple[tuple[str, ...], ...] = ((), (), ())  # per field (metric, region, period), sorted
    numbers: frozenset[str] = frozenset()  # set by after()
    slots: frozenset[str] = frozenset()  # results that are slots (domain/agent_facts.py), set by after()

    @classmethod
    def sample(cls, question: str) -> CallNames:
        return cls(question, tuple(tuple(sorted(x)) for x in SAMPLE_NAMES))

    def after(self, results: Iterable[str]) -> CallNames:
        """These names, the numbers of the question and of `results` (the calls' so far) copyable;
        a result that is a slot as that slot, never its digits."""
        results = list(results)
        slots = {r for r in results if SLOT.fullmatch(r)}
        nums = {"100", *NUMBER.findall(SLOT.sub(" ", self.question)),
                *(n for r in results if r not in slots for n in NUMBER.findall(r))}
        return replace(self, numbers=frozenset(nums), slots=frozenset(slots))

    def starts(self, field: int, a: str) -> bool:
        """a may still grow into a name: it starts a word of the question, or a held name."""
        if not a or holds(self.question, a, whole=False):
            return True
        names = self.held[field]
        i = bisect.bisect_left(names, a)
        return i < len(names) and names[i].startswith(a)

    def names(self, field: int, a: str) -> bool:
        return bool(a) and (holds(self.question, a) or a in self.held[field])


def guided_call(call: str, names: CallNames) -> bool | None:
    """call: the text after `<call>` so far.  None: not inside a call's arguments (the tool's
    name still being written), so not guided.  Else whether it can still become a call training
    writes, then `</call>`: metric("m", "r", "p"), each argument a name `names` allows
    ('metric("Xfe' -> True where the question holds "Xfers 32"; 'metric("Xfg' -> False), or
    calc("expr"), each of its numbers one `names` allows ('calc("(6323.7-9' -> False where the
    results are 939823.2 and 6323.7); calc with no numbers known (no after()) is not guided."""
    if call.startswith(_METRIC):
        return _metric_call(call[len(_METRIC):], names)
    if call.startswith(_CALC) and names.numbers:
        return _calc_call(call[len(_CALC):], names)
    return None


def _metric_call(text: str, names: CallNames) -> bool:
    parts = text.split('"')  # names hold no '"': argument, separator, argument, ...
    if len(parts) > 6:
        return False
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        if k % 2 == 0:  # argument k // 2
            ok = names.starts(k // 2, part) if last else names.names(k // 2, part)
        else:  # what follows its closing '"': the separator's rest, or the call's end
            rest = ", " if k < 5 else ")" + END_CALL
            ok = rest.startswith(part) if last else part == rest
        if not ok:
            return False
    return True


def _calc_call(text: str, names: CallNames) -> bool:
    expr, quote, tail = text.partition('"')
    if quote and not (")" + END_CALL).startswith(tail):
        return False
    if any(m.group() not in names.slots for m in SLOT.finditer(expr)):  # a slot: a result's
        return False
    bare = SLOT.sub(" ", expr)
    part = _PART_SLOT.search(bare)  # a slot's text still being written ("[F1" of "[F12]")
    if part is not None:
        if quote or not any(s.startswith(part.group()) for s in names.slots):
            return False
        bare = bare[:part.start()]
    if not set(bare) <= _EXPR_CHARS:
        return False
    runs = list(DIGITS.finditer(bare))
    for k, m in enumerate(runs):
        open_ = not quote and part is None and k == len(runs) - 1 and m.end() == len(bare)  # still being written
        if not (any(n.startswith(m.group()) for n in names.numbers) if open_ else m.group() in names.numbers):
            return False
    return True


_PART_SLOT = re.compile(r"\[(?:F[0-9]*)?$")


# ---- generation ---------------------------------------------------------------------------


@dataclass
class Task:
    question: str
    calls: list[str]  # the expected call texts, in order
    answer: str  # the expected final number
    final: str  # the final answer line (without the "A: " prefix)


def metric_name(key: str) -> str:
    return METRIC[key][1].lower()


METRIC_KEYS = {metric_name(k): k for k in METRIC}  # a metric as a question names it -> its key
#: what the sample dataset holds by name, per field (a question's names the runtime makes slots)
SAMPLE_NAMES = (tuple(METRIC_KEYS), REGIONS, PERIODS)


def _unit(key: str) -> str:
    return METRIC[key][2]


def make_task(rng: random.Random, data: Dataset) -> Task:
    kind = rng.choice(("lookup", "change", "total", "diff", "arith", "arith"))
    key = rng.choice([m[0] for m in METRICS])
    m = metric_name(key)  # as the question names it, and so the calls and the answer
    if kind == "lookup":
        r, p = rng.choice(REGIONS), rng.choice(PERIODS)
        v = data.lookup(key, r, p)
        q = rng.choice((f"What was {m} in {r} in {p}?", f"Look up {m} for {r}, {p}."))
        return Task(q, [call_text("metric", m, r, p)], v, f"{m} in {r} in {p} was {v} {_unit(key)}.")
    if kind == "change":
        r = rng.choice(REGIONS)
        p1, p2 = sorted(rng.sample(PERIODS[:8], 2))
        v1, v2 = data.lookup(key, r, p1), data.lookup(key, r, p2)
        expr = f"({v2}-{v1})/{v1}*100"
        res = calc(expr)
        q = f"By how much did {m} in {r} change from {p1} to {p2}, in percent?"
        return Task(q, [call_text("metric", m, r, p1), call_text("metric", m, r, p2), call_text("calc", expr)],
                    res, f"{m} in {r} changed by {res}% from {p1} to {p2}.")
    if kind == "total":
        regions, p = rng.sample(REGIONS, rng.randint(2, 3)), rng.choice(PERIODS)
        vals = [data.lookup(key, r, p) for r in regions]
        expr = "+".join(vals)
        res = calc(expr)
        where = ", ".join(regions[:-1]) + " and " + regions[-1]
        q = f"What was the total {m} across {where} in {p}?"
        return Task(q, [call_text("metric", m, r, p) for r in regions] + [call_text("calc", expr)], res,
                    f"Total {m} across {where} in {p} was {res} {_unit(key)}.")
    if kind == "diff":
        r1, r2 = rng.sample(REGIONS, 2)
        p = rng.choice(PERIODS)
        v1, v2 = data.lookup(key, r1, p), data.lookup(key, r2, p)
        expr = f"{v1}-{v2}"
        res = calc(expr)
        q = f"How much higher was {m} in {r1} than in {r2} in {p}?"
        return Task(q, [call_text("metric", m, r1, p), call_text("metric", m, r2, p), call_text("calc", expr)],
                    res, f"{m} in {r1} was {res} {_unit(key)} higher than in {r2}.")
    # plain arithmetic
    a, b = rng.randint(2, 9999), rng.randint(2, 999)
    op = rng.choice("+-*/")
    if rng.random() < 0.3:
        c = rng.randint(2, 999)
        op2 = rng.choice("+-")
        expr = f"({a}{op}{b}){op2}{c}"
    else:
        expr = f"{a}{op}{b}"
    res = calc(expr)
    shown = expr.replace("*", " * ").replace("/", " / ").replace("+", " + ").replace("-", " - ")
    q = rng.choice((f"What is {shown}?", f"Compute {shown}.", f"Calculate {shown}."))
    return Task(q, [call_text("calc", expr)], res, f"The result is {res}.")


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


def _wild_arg(rng: random.Random) -> str:
    """A name as a call's argument holds it: the API's name grammar, lower case for a metric; not
    a bare number (an answer that restates it could not be told from its result by a reader)."""
    while True:
        name = draws.wild_name(rng)
        if not NUMBER.fullmatch(name):
            return name


def wild_task(rng: random.Random) -> tuple[Task, Store]:
    """A question over a store whose metrics, regions and periods are drawn from the API's
    grammar (any names, periods, numbers of 1-9 digits with up to 2 decimals), not the corpus's
    lists: the same four kinds as make_task's, the calls copying the names from the question."""
    metric = _wild_arg(rng).lower()
    regions = list(dict.fromkeys(_wild_arg(rng) for _ in range(3)))
    periods = list(dict.fromkeys(draws.wild_period(rng) for _ in range(2)))
    dec = rng.choice((0, 0, 1, 2))
    values: dict[tuple[str, str, str], str] = {}

    def value(r: str, p: str) -> str:
        if (metric, r, p) not in values:
            v = draws.wild_number(rng, rng.randint(1, 6), dec)
            values[metric, r, p] = format_number(float(v))
        return values[metric, r, p]

    tail = ""  # a tenant's table gives no unit: an answer that wrote one would make it up
    kind = rng.choice(("lookup", "change", "total", "diff"))
    r, p = regions[0], periods[0]
    if kind == "lookup" or (kind == "change" and len(periods) < 2) or (kind != "lookup" and len(regions) < 2):
        v = value(r, p)
        q = rng.choice((f"What was {metric} in {r} in {p}?", f"Look up {metric} for {r}, {p}."))
        return Task(q, [call_text("metric", metric, r, p)], v, f"{metric} in {r} in {p} was {v}{tail}."), Store(values)
    if kind == "change":
        p1, p2 = periods
        v1, v2 = value(r, p1), value(r, p2)
        if float(v1) == 0:
            return wild_task(rng)
        expr = f"({v2}-{v1})/{v1}*100"
        res = calc(expr)
        q = f"By how much did {metric} in {r} change from {p1} to {p2}, in percent?"
        return Task(q, [call_text("metric", metric, r, p1), call_text("metric", metric, r, p2), call_text("calc", expr)],
                    res, f"{metric} in {r} changed by {res}% from {p1} to {p2}."), Store(values)
    if kind == "total":
        vals = [value(x, p) for x in regions]
        expr = "+".join(vals)
        res = calc(expr)
        where = ", ".join(regions[:-1]) + " and " + regions[-1]
        q = f"What was the total {metric} across {where} in {p}?"
        return Task(q, [call_text("metric", metric, x, p) for x in regions] + [call_text("calc", expr)], res,
                    f"Total {metric} across {where} in {p} was {res}{tail}."), Store(values)
    r1, r2 = regions[:2]
    v1, v2 = value(r1, p), value(r2, p)
    expr = f"{v1}-{v2}"
    res = calc(expr)
    q = f"How much higher was {metric} in {r1} than in {r2} in {p}?"
    return Task(q, [call_text("metric", metric, r1, p), call_text("metric", metric, r2, p), call_text("calc", expr)],
                res, f"{metric} in {r1} was {res}{tail} higher than in {r2}."), Store(values)


def transcript(task: Task, data: Dataset | Store) -> list[tuple[str, bool]]:
    """The assistant's side after the prompt, as (text, given) pieces: given pieces are the
    runtime's tool results."""
    out: list[tuple[str, bool]] = []
    for c in task.calls:
        out.append((f"{CALL}{c}{END_CALL}", False))
        out.append((f"{RESULT}{run_call(c, data)}{END_RESULT}\n", True))
    out.append((f"A: {task.final}", False))
    return out


def prompt_text(question: str) -> str:
    return f"Q: {question}\n"


def example(rng: random.Random) -> tuple[Task, Dataset, list[tuple[str, bool]]]:
    data = Dataset(rng.randrange(2**31))
    task = make_task(rng, data)
    return task, data, transcript(task, data)


def wild_example(rng: random.Random) -> tuple[Task, Store, list[tuple[str, bool]]]:
    task, store = wild_task(rng)
    return task, store, transcript(task, store)


def slipped(task: Task, store: Store, rng: random.Random) -> list[tuple[str, bool]]:
    """The transcript with one metric call first miscopied (a character of one name replaced,
    dropped or added, as the model slips: "Xfers 32" -> "Xfgis 32", "st1m7" -> "s1m7"), its error
    result as the runtime's tenant table gives it (no_row, with the question: the hint), then the
    call mended.  The slip and its result are given (no loss: the model learns to mend a call, not
    to miscopy one); the rest is transcript()'s."""
    pieces = transcript(task, store)
    at = [i for i, c in enumerate(task.calls) if c.startswith("metric(")]
    held = held_names(store.values)
    for _ in range(20):  # a slip that is still a held name is no slip: another draw
        i = rng.choice(at)
        args = ARG_RE.findall(task.calls[i])
        f = rng.randrange(3)
        wrong = _slip(args[f], rng)
        if wrong and wrong == grammar.canonical(wrong) and wrong not in held[f]:  # as the runtime reads it
            args[f] = wrong
            call = call_text("metric", *args)
            said = error_result(str(no_row((args[0], args[1], args[2]), held, task.question)))
            slip = [(f"{CALL}{call}{END_CALL}", True), (f"{RESULT}{said}{END_RESULT}\n", True)]
            return pieces[:2 * i] + slip + pieces[2 * i:]
    return pieces


def _slip(name: str, rng: random.Random) -> str:
    """name with one character replaced, dropped or added (a letter or digit)."""
    j = rng.randrange(len(name))
    c = rng.choice(string.ascii_letters + string.digits)
    kind = rng.choice(("replace", "replace", "drop", "add"))
    if kind == "replace":
        return name[:j] + c + name[j + 1:]
    if kind == "drop":
        return name[:j] + name[j + 1:]
    return name[:j] + c + name[j:]
