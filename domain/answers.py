"""How an agent's transcript and its answer are read back and verified (the transcripts of
domain/agent.py: calls, the runtime's results, then "A: ...").

The answer is the model's last segment's: what follows its "A:" after the last result, never
text a result holds (a result is the runtime's or a client's, and may say anything).  Two
readers:

- `check` compares a finished transcript with its Task: the calls, and the number the data
  fixes (the benchmarks, the tests);
- `verify` says, with no task, whether an answer and the calls it rests on hold: the calls fit
  the question (names it names, no call repeated, a calc's numbers from earlier results or the
  question) and the answer states the last call's result and no number nobody said (the
  runtime's checked answer, workflows/agent.py); a result in words (a client's function's
  output, is_text) is stated by quoting it whole, never read for its numbers.

domain/agent.py holds what the tools do, what training writes and the guide; this module what
is accepted of a transcript, which reads calls and numbers as they do (parse_call, NUMBER).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from domain import grammar
from domain.agent import ANSWERS, Task
from domain.facts import SLOT
from domain.payload import METRIC, METRICS, PERIODS
from domain.tools import (
    ARG_RE,
    CALL,
    DIGITS,
    END_CALL,
    END_RESULT,
    FIELDS,
    METRIC_KEYS,
    NUMBER,
    ToolError,
    holds,
    is_text,
    metric_name,
    parse_call,
    question_names,
)

# ---- checking against a task -------------------------------------------------------------

_CALLS = re.compile(re.escape(CALL) + r"(.*?)" + re.escape(END_CALL), re.DOTALL)
_ANSWER_NUM = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")


@dataclass
class Check:
    tool_call_ok: bool  # the calls made are exactly the expected ones, in order
    answer_ok: bool  # the final answer states the expected number (and no other)
    calls: list[str]
    answer: str | None


def answer_numbers(answer: str) -> list[str]:
    """The numbers an answer states, in order (a period such as 2026-Q3 is a name, not a number)."""
    for p in PERIODS:
        answer = answer.replace(p, " ")
    return _ANSWER_NUM.findall(answer)


def stray_numbers(nums: list[str], question: str, results: Collection[str]) -> list[str]:
    """The numbers an answer states (answer_numbers) that no result and no name of the question
    holds: "in Xf down 3" for the question's "in Xfers 32" states a 3 nothing said."""
    return [n for n in nums if n not in results and not holds(question, n.lstrip("-"))]


def check(task: Task, text: str) -> Check:
    """`text`: the assistant's side of a finished transcript (calls, results, answer); its answer
    is its last segment's (answer_of), never text a result holds."""
    calls = [c.strip() for c in _CALLS.findall(text)]
    answer = answer_of(last_segment(text))
    if answer is not None:
        # names are not numbers: the periods, and whatever the task's metric calls name (a wild
        # store's names and periods may hold digits)
        names = {a for c in task.calls if c.startswith("metric(") for a in ARG_RE.findall(c)}
        for p in sorted(names | set(PERIODS), key=len, reverse=True):  # a whole name, not a number's digits
            answer = re.sub(rf"(?<![\w.]){re.escape(p)}(?!\w)", " ", answer)
    nums = answer_numbers(answer) if answer is not None else []
    said = _unit_after(answer, task.answer) if answer is not None else None
    # none said is no wrong one; a task with no final line (a test's) gives none to compare with
    right_unit = said is None or not task.final or said == _unit_after(task.final, task.answer)
    return Check(calls == task.calls, nums == [task.answer] and right_unit, calls, answer)


def _unit_after(text: str, number: str) -> str | None:
    """The unit `text` writes right after the first `number` it states ("percent" is %); None: none."""
    m = re.search(rf"(?<![\w.]){re.escape(number)}(?!\w|\.\d)", text)  # "15412." ends a sentence
    u = _UNIT_AFTER.match(text, m.end()) if m else None
    return None if u is None else "%" if u.group(1) == "percent" else u.group(1)


# ---- verifying an answer ------------------------------------------------------------------
# What a job can say of its own answer, with no task to compare it with: the answer is the
# model's last segment, verified only where every call it rests on fits the question and it
# states the last call's result.  `made`: each call's text and its result, in order.

_PERCENT_CHANGE = re.compile(r"\((-?[0-9.]+)-(-?[0-9.]+)\)/(-?[0-9.]+)\*100")  # (a-b)/b*100, spaces left out


def last_segment(text: str) -> str:
    """A flat transcript's last segment: what the model wrote after the last result (a result is
    the runtime's or a client's text, which may hold anything an error says, "A: 12" too)."""
    return text.rsplit(END_RESULT, 1)[-1]


def segment_problems(segment: str) -> list[str]:
    """What a last segment of a model trained on the answer forms writes besides its answer:
    training's is "A: " and the answer, nothing before its "A:" (a word there is in the transcript
    a job returns as much as one in the answer).  A text model's segment is its own."""
    head = segment.partition("A:")[0].strip()
    return [f"the last segment writes {head!r} before its answer"] if head else []


def answer_of(segment: str) -> str | None:
    """The answer one segment gives: what follows its first "A:" (all of it is checked); None
    where it has none, or holds a call (a segment that calls does not answer)."""
    if CALL in segment or "A:" not in segment:
        return None
    return segment.split("A:", 1)[1]


_WORD_BREAK = re.compile(r"[\s+*()]+")  # no name or period holds + * ( ) (narrative.NAME_RE, PERIOD_RE)


def question_numbers(question: str) -> set[str]:
    """The numbers a question writes as numbers: its words (split at spaces, + * and
    parentheses; a sign before, the sentence's punctuation after, left out) that are a number.
    Digits joined to a name's or a period's characters are not one: "2026" of "2026-Q1" or of
    "2026-03", "41" of "W41-2090", "12" of "Ab/12" are no operand (and so neither is "40-2"'s 40:
    a period may be written so).  "What is (4821+37) - 5?" -> {"4821", "37", "5"}."""
    words = (w.lstrip("-").rstrip("?.,!:;") for w in _WORD_BREAK.split(question))
    return {w for w in words if NUMBER.fullmatch(w)}


def verify(question: str, made: Sequence[tuple[str, str]], answer: str, sample: bool = False,
           names: Collection[str] | None = None, units: bool | None = None, forms: bool = False,
           texts: Collection[str] | None = None) -> list[str]:
    """What is wrong with an answer and the calls it rests on; [] = verified.  sample: the
    metrics are the sample dataset's (Dataset).  names: the question's names that its source
    holds (workflows/agent.py: its slots; None: not known, for a text model).  units: the rows
    read are the sample dataset's, whose metrics have units (default: sample; a client's metric
    tool has the sample's names but its own data).  forms: the model was trained on the answer
    forms (setflow's): its answer's words are theirs (form_problems).  texts: what a call of one
    text may take, where it is a client's function whose other arguments the question fills
    (domain/arguments.py: the names it gives the one the model writes)."""
    return (call_problems(question, made, sample, names, texts) + intent_problems(question, made, names, texts)
            + answer_problems(question, made, answer) + unit_problems(made, answer, sample if units is None else units)
            + (form_problems(made, answer) if forms else []))


def call_problems(question: str, made: Sequence[tuple[str, str]], sample: bool = False,
                  names: Collection[str] | None = None, texts: Collection[str] | None = None) -> list[str]:
    """What makes the calls not fit the question; [] = they fit.  A call that failed (its result
    "error: ...") gave nothing to rest on and is not held to these; every other call
    - names, in a metric call, what the question names (_asks): no region or period it did not ask about;
    - reads, in a call of one argument that holds a letter (a client's function of one text: a
      read by a name, not arithmetic), a name the question writes (named_call); where `texts`
      is given (a client's function whose other arguments the question fills), one of them;
    - repeats no earlier call that gave a result: one row read twice is no total ("6114+6114");
    - computes, in a calc, from the numbers of earlier results, or, where no metric call was made
      (arithmetic: the corpus never asks both), from the numbers the question writes
      (question_numbers), nothing else: 100 only where the question writes it, or as the 100 of
      a percent change (a-b)/b*100 of two results that the question asks for in percent."""
    problems: list[str] = []
    seen: set[tuple[str, ...]] = set()
    results: set[str] = set()  # the numbers of the results so far
    metrics = any(c.strip().startswith("metric(") for c, _ in made)
    asked = set() if metrics else question_numbers(question)
    nobody = "no earlier result holds" + ("" if metrics else " and the question does not write as a number")
    for call, result in made:
        if result.startswith("error:"):
            continue
        try:
            tool, args = parse_call(call)
        except ToolError:  # the tools answer such a call with an error: no result can rest on it
            problems.append(f"{call!r} gave a result but is no call")
            continue
        key = (tool, *map(grammar.canonical, args)) if tool == "metric" else (tool, args[0].replace(" ", ""))
        if key in seen:
            problems.append(f"{call} repeats an earlier call")
        seen.add(key)
        if tool == "metric":
            problems += [f"{call} reads {FIELDS[f]} {a!r}, which the question does not name"
                         for f, a in enumerate(args) if not _asks(question, f, a, sample)]
        elif texts is not None:  # the client's function filled from the question: what it gives the one written
            if args[0] not in texts:
                problems.append(f"{call} reads {args[0]!r}, which the question does not give that function")
        elif _has_letter(args[0]):  # a read by a name: named_call, or nothing it can be told from
            if not named_call(question, args, names):
                problems.append(f"{call} reads {args[0]!r}, which is no name the question writes")
        else:
            problems += [f"{call} uses {n}, which {nobody}"
                         for n in _operands(args[0], question, results) if n not in results and n not in asked]
        results.update(NUMBER.findall(result))
    return problems


def _has_letter(text: str) -> bool:
    return any(c.isalpha() for c in text)


#: two numbers with an operator between them, as arithmetic writes them ("4821 + 37", "(3+4)*2")
_OPERATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\)*\s*[-+*/×÷]\s*\(*-?([0-9]+(?:\.[0-9]+)?)")


def asks_arithmetic(question: str) -> bool:
    """The question writes arithmetic: an operator between two numbers it writes as numbers
    (question_numbers: not a period's "2026-03", not a name's "W41-2090")."""
    numbers = question_numbers(question)
    return any(m[1] in numbers and m[2] in numbers for m in _OPERATION.finditer(question))


def text_arguments(question: str) -> list[str]:
    """The names a call of one text argument (a client's function: `get_weather(location)`,
    `lookup_user(email)`) may take: those the question writes (question_names) that hold a
    letter, where it writes no arithmetic (asks_arithmetic: then it asks a calculator, whose
    argument is an expression); else none."""
    if asks_arithmetic(question):
        return []
    return [n for n in question_names(question) if _has_letter(n)]


def named_call(question: str, args: Sequence[str], names: Collection[str] | None = None) -> bool:
    """A call of one argument that reads by a name: the argument holds a letter and is a name
    the question writes (text_arguments) or one its source holds that it holds whole (`names`)."""
    if len(args) != 1 or not _has_letter(args[0]):
        return False
    a = grammar.canonical(args[0])
    return a in map(grammar.canonical, text_arguments(question)) or any(
        grammar.canonical(n) == a and holds(question, n) for n in (names or ()))


def _asks(question: str, field: int, name: str, sample: bool) -> bool:
    """Does the question name `name` (field: FIELDS' index): hold it whole, as the corpus's
    questions hold every name their calls copy; a sample metric's key also where the question
    says its name, in any case ("average order value": aov)."""
    q, name = grammar.canonical(question), grammar.canonical(name)  # as the tools look it up
    if holds(q, name):
        return True
    return sample and field == 0 and name in METRIC and (holds(q.lower(), name) or holds(q.lower(), metric_name(name)))


def _operands(expr: str, question: str, results: Collection[str]) -> list[str]:
    """A calc's numbers, in order; the 100 of a percent change left out where it is one:
    (a-b)/b*100, a and b results, in a question that asks in percent (as make_task's change)."""
    nums = DIGITS.findall(expr)
    m = _PERCENT_CHANGE.fullmatch(expr.replace(" ", ""))
    in_percent = "percent" in question.lower() or "%" in question
    if m and in_percent and m[2] == m[3] and m[1].lstrip("-") in results and m[2].lstrip("-") in results:
        nums.pop()  # the 100: the formula's last number
    return nums


_DIFFERENCE = re.compile(r"(-?[0-9.]+)-(-?[0-9.]+)")  # a-b, spaces left out
Reads = list[tuple[list[str], str]]  # the metric calls that gave a result: (their arguments, the row read)


def _sum_problems(question: str, expr: str, reads: Reads) -> list[str]:
    """A sum: the last calc adds up every row read, each once."""
    values = [r for _, r in reads]
    if sorted(expr.split("+")) != sorted(values):
        return [f"the question asks for a sum of the {len(values)} rows read, and calc({expr!r}) is not"]
    return []


def _difference(expr: str) -> tuple[tuple[str, str] | None, list[str]]:
    """a-b as (a, b), a the row the question says first."""
    m = _DIFFERENCE.fullmatch(expr)
    return (None if m is None else (m[1], m[2])), []


def _percent_change(expr: str) -> tuple[tuple[str, str] | None, list[str]]:
    """(a-b)/b*100 as (b, a), b the row the question says first ("from P1 to P2"); from a value of
    0 or below no percent change is given."""
    m = _PERCENT_CHANGE.fullmatch(expr)
    if m is None or m[2] != m[3]:
        return None, []
    if m[3].startswith("-") or not m[3].strip("0."):  # 0 or below: a narrative gives none; -80 -> -40 is "-50%"
        return (m[2], m[1]), [f"calc({expr!r}) is a percent change from {m[3]}: from a value of 0 or below "
                              "a percent change is not given (its sign would mislead)"]
    return (m[2], m[1]), []


def _of_two_rows(name: str, pair_of: Callable[[str], tuple[tuple[str, str] | None, list[str]]]
                 ) -> Callable[[str, str, Reads], list[str]]:
    """An operation over two rows: the last calc is `pair_of`'s form over the two rows read, in
    the order the question says them."""
    def problems(question: str, expr: str, reads: Reads) -> list[str]:
        values = [r for _, r in reads]
        pair, out = pair_of(expr)  # (the row the question says first, the other)
        if len(reads) != 2 or pair is None or sorted(pair) != sorted(values):
            return [*out, f"the question asks for a {name} of two rows, and calc({expr!r}) is not one of the rows read"]
        if values.index(pair[0]) != _said_first(question, reads[0][0], reads[1][0]) and values[0] != values[1]:
            out.append(f"calc({expr!r}) takes its rows in the other order than the question says them")
        return out
    return problems


@dataclass(frozen=True)
class Operation:
    """An operation a question may ask for over the rows it names: the words by which it asks
    (looked for in the question without its names: a metric may be called "Total revenue"), and
    what is wrong with the last calc as that operation: (question, calc, rows read) -> problems."""

    cue: re.Pattern[str]
    problems: Callable[[str, str, Reads], list[str]]


#: the operations a question asks for by its words: the agent models' phrasings and their common
#: variants (English); a question that says none of them asks for one row
OPERATIONS = {
    "sum": Operation(re.compile(r"\b(total|sum|add up|combined)\b"), _sum_problems),
    "difference": Operation(re.compile(r"\b(higher|exceed|exceeds|exceeded|more than)\b"),
                            _of_two_rows("difference", _difference)),
    "percent change": Operation(re.compile(r"\bpercent\b|%"), _of_two_rows("percent change", _percent_change)),
}


def intent_problems(question: str, made: Sequence[tuple[str, str]], names: Collection[str] | None = None,
                    texts: Collection[str] | None = None) -> list[str]:
    """What makes the calls not compute what the question asks (call_problems holds each call
    to the question's names; this, the whole of them to its question), as far as its words say
    (OPERATIONS), else nothing can be verified:
    - every name the question holds that its source knows (`names`) is read by a metric call;
    - no operation asked: one row, read by one metric call, and no calc;
    - a sum: the last calc adds up every row read, each once;
    - a difference: the last calc is a-b of two rows, a the one whose name the question says first
      ("How much higher was X in A than in B");
    - a percent change: the last calc is (a-b)/b*100 of two rows, b the one whose name the question
      says first ("from P1 to P2");
    - more than one operation asked: which one cannot be told;
    - no metric call (arithmetic): each calc is an expression the question writes out;
    - a read by a name (named_call, or one of `texts`: call_problems): it is the one call that
      gave a result; by a name, each name of the source the question writes is read (not so for
      `texts`: the function's arguments are the question's by construction, domain/arguments.py,
      and the source's names, the sample's "churn", are not its)."""
    parsed: list[tuple[str, list[str], str]] = []
    for call, result in made:
        if result.startswith("error:"):
            continue
        try:
            parsed.append((*parse_call(call), result))
        except ToolError:
            return []  # call_problems says so
    by_name = [args[0] for tool, args, _ in parsed
               if tool == "calc" and (named_call(question, args, names) or (texts is not None and args[0] in texts))]
    if by_name:  # a read by a name: the answer rests on that one call
        read = {grammar.canonical(a) for a in by_name}
        return [*(f"the question names {n!r}, which no call reads" for n in (names or ())
                  if grammar.canonical(n) not in read and texts is None),
                *([] if len(parsed) == 1 else [f"the answer rests on {len(parsed)} calls, one of them a read by the "
                                               f"name {by_name[0]!r}: which one answers cannot be told"])]
    reads = [(args, r) for tool, args, r in parsed if tool == "metric"]
    calcs = [args[0].replace(" ", "") for tool, args, _ in parsed if tool == "calc"]
    read = {grammar.canonical(a) for args, _ in reads for a in args}
    problems = [f"the question names {n!r}, which no call reads" for n in (names or ()) if grammar.canonical(n) not in read]
    if not reads:
        written = _as_calc(question)
        return [*problems, *(f"calc({e!r}) is no expression the question writes" for e in calcs if e not in written),
                *_arithmetic_problems(question, calcs)]
    said = question
    for n in sorted({*(names or ()), *(a for args, _ in reads for a in args)} - {""}, key=len, reverse=True):
        said = _whole(n).sub(" ", said)
    asked = [name for name, op in OPERATIONS.items() if op.cue.search(said.lower())]
    if len(asked) > 1:
        return [*problems, f"the question asks for a {' and a '.join(asked)}: which one cannot be told"]
    op = asked[0] if asked else None
    if op is None:
        if len(reads) != 1 or calcs:
            problems.append(f"the question asks for one row (it names no operation), and the answer rests on "
                            f"{len(reads)} rows read and {len(calcs)} calc(s)")
        return problems
    if parsed[-1][0] != "calc":
        return [*problems, f"the question asks for a {op}, and the answer rests on no calc"]
    return [*problems, *OPERATIONS[op].problems(question, calcs[-1], reads)]


#: what a question writes as arithmetic: a run of numbers, operators and parentheses
_WRITTEN = re.compile(r"[-+*/×÷().\d\s]*\d[-+*/×÷().\d\s]*")
#: the words that only frame an expression ("What is ...?", "Compute ...", "How much is ...?")
_FRAMING = frozenset("what what's whats is it compute calculate evaluate work out the result value of please "
                     "how much equals equal to".split())


def _as_calc(text: str) -> str:
    """Arithmetic as a calc writes it: no spaces, × and ÷ as * and /."""
    return text.replace(" ", "").replace("×", "*").replace("÷", "/")


def _arithmetic_problems(question: str, calcs: list[str]) -> list[str]:
    """Arithmetic (no metric call): the last calc is the one expression the question writes,
    whole, and the question's other words only frame it (_FRAMING), as far as they can be told:
    "What is 45 + 55 + 12?" answered by calc("45+55") computed a part of it, and "What is half of
    3 + 4?" or "What is 2 + 3 and 4 + 5?" ask more than one calc of what they write."""
    spans = [m.strip().rstrip(".").strip() for m in _WRITTEN.findall(question)]
    if len(spans) != 1:
        return [f"the question writes {len(spans)} expressions or numbers apart ({', '.join(map(repr, spans))}): "
                "what it asks of them cannot be told"]
    whole = _as_calc(spans[0])
    if calcs and calcs[-1] != whole:
        return [f"calc({calcs[-1]!r}) is not the whole expression the question writes, {whole!r}"]
    words = set(re.findall(r"[^\W\d_]+(?:'[^\W\d_]+)?", _WRITTEN.sub(" ", question.replace("’", "'")).lower()))
    if words - _FRAMING:
        return [f"the question says {sorted(words - _FRAMING)} beside the expression it writes: what it asks of it "
                "cannot be told"]
    return []


def _whole(name: str) -> re.Pattern[str]:
    """`name` where a question holds it whole: no letter or digit beside it (as source_names finds it)."""
    return re.compile(rf"(?<![^\W_]){re.escape(name)}(?![^\W_])")


def _said_first(question: str, a: list[str], b: list[str]) -> int:
    """Of two metric calls' arguments, which call's (0 or 1) the question says first: where the
    first argument they differ in appears whole (0 where none differs, or neither appears)."""
    for x, y in zip(a, b):
        if grammar.canonical(x) != grammar.canonical(y):
            at = [m.start() if (m := _whole(n).search(question)) else len(question) for n in (x, y)]
            return int(at[1] < at[0])
    return 0


def answer_problems(question: str, made: Sequence[tuple[str, str]], answer: str) -> list[str]:
    """What makes the answer not the calls': it states the number the last call returned, and no
    number that no result and no name of the question holds (stray_numbers); a result in words
    (is_text) it quotes whole, once, and its other words state no number; and, written out, it
    holds no fact slot (a slot that names no fact of its table stays as its text: garbled)."""
    if (slot := SLOT.search(answer)) is not None:
        return [f"the answer holds {slot[0]}, a fact slot that names no fact"]
    if not made or made[-1][1].startswith("error:"):
        why = "no call was made" if not made else "the last call failed"
        return [f"the answer rests on no result: {why}"]
    number = made[-1][1]
    if is_text(number):
        if answer.count(number) != 1:
            return [f"the answer does not quote {number!r}, what the last call returned, whole and once"]
        rest = answer_numbers(unquoted(answer, made))
        stray = stray_numbers(rest, question, [r for _, r in made if not is_text(r)])
        return [f"the answer states {stray} beside its quote, which no result and no name in the question holds"
                ] if stray else []
    nums = answer_numbers(unquoted(answer, made))
    if number not in nums:
        return [f"the answer states {nums}, not {number}, the number the last call returned"]
    stray = stray_numbers(nums, question, [r for _, r in made])
    return [f"the answer states {stray} too, which no result and no name in the question holds"] if stray else []


def unquoted(answer: str, made: Sequence[tuple[str, str]]) -> str:
    """The answer with each result in words it quotes (is_text) blanked, its length kept: a
    quote's digits ("64 degrees") are the tool's words, no number the answer states."""
    for t in sorted({r for _, r in made if is_text(r)}, key=len, reverse=True):
        answer = answer.replace(t, " " * len(t))
    return answer


def slot_problems(answer: str) -> list[str]:
    """What is wrong with an answer in slot form (what a model that points at facts wrote) that
    its written-out text may hide: a fact said twice ("... to [F4][F4]." reads "to Oct. 2026Oct.
    2026."), which no answer training writes does; a reader would take it for a garbled one."""
    said = [m.group(0) for m in SLOT.finditer(answer)]
    twice = sorted({s for s in said if said.count(s) > 1}, key=said.index)
    return [f"the answer says {s} more than once" for s in twice]


# ---- an answer's words: the forms training writes ----------------------------------------------

_FIELD = re.compile(r"\{(\w+)\}")
#: each answer form as its parts: a literal, or a field's name in braces (domain/agent.py ANSWERS)
_FORMS = [[p for p in re.split(r"(\{\w+\})", form) if p] for form in ANSWERS.values()]
_RESULT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_BEGUN_RESULT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?)?")  # "-." is no beginning: no number follows it


@dataclass(frozen=True)
class Field:
    """What a form's field may hold: whole(value); begun(value): value may still grow into one
    (true of every beginning of a whole one, so a reading stops where it turns false)."""

    whole: Callable[[str], bool]
    begun: Callable[[str], bool]


#: which of a metric call's arguments (FIELDS) each name field of the forms says
_NAME_FIELDS = {"metric": 0, "region": 1, "region2": 1, "regions": 1, "period": 2, "period2": 2}

#: a name of a field (FIELDS' index) as the forms read it: (whole, begun)
NameRule = Callable[[int, str], bool]


def form_fields(name: NameRule, name_begun: NameRule,
                number: Callable[[str], bool] = lambda x: _RESULT.fullmatch(x) is not None,
                number_begun: Callable[[str], bool] = lambda x: _BEGUN_RESULT.fullmatch(x) is not None
                ) -> dict[str, Field]:
    """The answer forms' fields: each name field a name of its argument (`name`: a metric, a
    region, a period), {regions} a list of two or more regions ("A, B and C"), {number} a
    number, {unit} one of UNITS after a space, or none."""

    def listed(x: str) -> bool:  # "A" or "A, B"
        return name(1, x) or any(name(1, x[i + 2:]) and listed(x[:i]) for i in _at(x, ", "))

    def names(x: str) -> bool:  # the last after " and ", the others after ", "; a name may hold either
        return any(name(1, x[i + 5:]) and listed(x[:i]) for i in _at(x, " and "))

    def names_begun(x: str) -> bool:  # names so far, each whole but the last, and their separators
        if name_begun(1, x):
            return True
        for sep in (", ", " and "):
            if any(name(1, x[:i]) and names_begun(x[i + len(sep):]) for i in _at(x, sep)):
                return True
            if any(x.endswith(sep[:j]) and name(1, x[:-j]) for j in range(1, len(sep))):  # one being written
                return True
        return False

    def of(f: int) -> Field:
        return Field(lambda x: name(f, x), lambda x: name_begun(f, x))

    return {**{k: of(f) for k, f in _NAME_FIELDS.items() if k != "regions"}, "regions": Field(names, names_begun),
            "number": Field(number, number_begun),
            "unit": Field(lambda x: x == "" or (x[:1] == " " and x[1:] in UNITS),
                          lambda x: x == "" or (x[:1] == " " and any(u.startswith(x[1:]) for u in UNITS)))}


#: where a reading of a text stands: (form, part, the offset in the text where that part starts)
State = tuple[int, int, int]


@dataclass(frozen=True)
class AnswerForms:
    """The answer forms with their fields, read left to right: the states a text reaches (each
    form's parts whole up to a part, that part begun at an offset), so that a guide asking about
    many next tokens after one text reads that text once (`open`, then `open(longer, after=...)`)."""

    fields: dict[str, Field]

    def _reach(self, text: str, seeds: Iterable[State]) -> set[State]:
        todo = list(seeds)
        seen = set(todo)
        while todo:
            f, i, k = todo.pop()
            parts = _FORMS[f]
            if i == len(parts):
                continue
            nxt: list[State] = []
            if (m := _FIELD.fullmatch(parts[i])) is None:
                if text.startswith(parts[i], k):
                    nxt.append((f, i + 1, k + len(parts[i])))
            else:
                field = self.fields[m[1]]
                for e in range(k, len(text) + 1):
                    if not field.begun(text[k:e]):
                        break
                    if field.whole(text[k:e]):
                        nxt.append((f, i + 1, e))
            for st in nxt:
                if st not in seen:
                    seen.add(st)
                    todo.append(st)
        return seen

    def whole(self, text: str) -> bool:
        """`text` is one of the forms."""
        return any(i == len(_FORMS[f]) and k == len(text) for f, i, k in self._reach(text, self._starts()))

    def open(self, text: str, after: Iterable[State] | None = None) -> tuple[State, ...]:
        """The states in which `text` may still become one of the forms (none: it cannot); after:
        open() of a text that `text` goes on from."""
        def still(f: int, i: int, k: int) -> bool:
            parts, rest = _FORMS[f], text[k:]
            if i == len(parts):
                return not rest
            m = _FIELD.fullmatch(parts[i])
            return parts[i].startswith(rest) if m is None else self.fields[m[1]].begun(rest)
        return tuple(sorted(st for st in self._reach(text, self._starts() if after is None else after) if still(*st)))

    def _starts(self) -> list[State]:
        """A form each of whose fields can hold something (no metric call read, no form with a
        name: one that starts "Total " would be a dead end)."""
        return [(f, 0, 0) for f, parts in enumerate(_FORMS)
                if all(m is None or self.fields[m[1]].begun("") for m in map(_FIELD.fullmatch, parts))]


def form_problems(made: Sequence[tuple[str, str]], answer: str) -> list[str]:
    """What makes an answer not one of the forms training writes (domain/agent.py ANSWERS): outside
    its facts, every word is one of a form's, and each fact is of its kind: a name that a metric
    call which gave a result read (any case; a sample metric's key also by its name), a list of
    two or more of them, a number or a result in words whole, a unit or none.  For a model trained on those forms (setflow's,
    which points at facts); a text model's answers are its own.  answer_problems and unit_problems
    hold the number and the unit to the calls'."""
    text = answer.strip()
    read: list[set[str]] = [set(), set(), set()]  # per argument: metric, region, period
    for tool, args, _ in _parsed(made):
        for f, x in enumerate(args if tool == "metric" else ()):
            read[f].add(grammar.canonical(x).lower())
    read[0] |= {metric_name(x).lower() for x in read[0] if x in METRIC}

    def name(f: int, x: str) -> bool:
        return x == x.strip() and grammar.canonical(x).lower() in read[f]

    def name_begun(f: int, x: str) -> bool:
        return any(n.startswith(grammar.canonical(x).lower()) for n in read[f])

    quoted = {r for _, r in made if is_text(r)}  # a result in words stands where a number does, whole
    fields = form_fields(name, name_begun, lambda x: x in quoted or _RESULT.fullmatch(x) is not None,
                         lambda x: any(t.startswith(x) for t in quoted) or _BEGUN_RESULT.fullmatch(x) is not None)
    if AnswerForms(fields).whole(text):
        return []
    return [f"the answer's words are not those of any answer form training writes: {text!r}"]


def answer_forms(names: Sequence[Collection[str]], results: Collection[str], quote: str | None = None) -> AnswerForms:
    """The answer forms as a model that points at facts writes them (slot form): its names those
    its metric calls read (`names`, per argument: a slot, or copied text), its number a result's
    slot (every result the model reads is one, domain/agent_facts.py: a number it writes as
    digits is one nothing gave it), or, where the last result is words (`quote`: its slot), that
    slot only (the runtime writes the words back: no number may stand for them); what a guide
    asks while the model writes (workflows/tools.py AnswerGuide).  form_problems holds the
    finished answer to the calls'."""
    number = {quote} if quote is not None else set(results)
    return AnswerForms(form_fields(
        lambda f, x: x in names[f], lambda f, x: any(n.startswith(x) for n in names[f]),
        lambda x: x in number, lambda x: any(r.startswith(x) for r in number)))


def begins_answer(text: str, names: Sequence[Collection[str]], results: Collection[str]) -> bool:
    """Whether `text`, an answer so far in slot form (what follows "A: "), may still become one of
    the answer forms (answer_forms)."""
    return bool(answer_forms(names, results).open(text))


def _at(text: str, sep: str) -> list[int]:
    """Where sep starts in text, each place."""
    return [m.start() for m in re.finditer(f"(?={re.escape(sep)})", text)]


#: the units an answer may write right after a number: the sample metrics' and a percent's;
#: longest first ("k USD" before "USD")
UNITS = sorted({m[2] for m in METRICS} | {"%", "percent"}, key=len, reverse=True)
_UNIT_AFTER = re.compile(r"\s*(" + "|".join(map(re.escape, UNITS)) + r")(?![^\W_])")


def unit_problems(made: Sequence[tuple[str, str]], answer: str, units: bool) -> list[str]:
    """The units an answer writes right after the numbers of its calls' results that nothing
    gives them (answer_problems holds the numbers, this what they are in): a percent change's
    result is in % ("percent"); a row of the sample dataset (`units`), and a calc over rows of one
    such metric, in that metric's unit (or none written); anything else (a tenant's table, a
    client's tool, plain arithmetic) has no unit, and neither has a result in words (is_text:
    its quote is whole as the tool wrote it).  "Total revenue across EMEA and APAC in 2026-Q3 was
    15412 %." states a revenue in percent: its unit is k USD."""
    if not made:
        return []
    parsed, result = _parsed(made), made[-1][1]
    percent = any(tool == "calc" and _PERCENT_CHANGE.fullmatch(args[0].replace(" ", "")) for tool, args, _ in _parsed(made[-1:]))
    keys = {METRIC_KEYS.get(k, k) for k in (grammar.canonical(args[0]).lower() for tool, args, _ in parsed if tool == "metric")}
    unit = METRIC[next(iter(keys))][2] if units and len(keys) == 1 and keys <= METRIC.keys() else None
    results = {r for _, r in made if not r.startswith("error:")}
    problems = [f"the answer writes {u[1]} after {t!r}, and nothing it read gives a unit"
                for t in sorted({r for r in results if is_text(r)}) for i in _at(answer, t)
                if (u := _UNIT_AFTER.match(answer, i + len(t)))]
    text = unquoted(answer, made)
    for p in PERIODS:  # a period is a name, not a number (answer_numbers): blanked, its length kept
        text = text.replace(p, " " * len(p))
    for m in _ANSWER_NUM.finditer(text):
        n = m.group(0)
        if n not in results or not (u := _UNIT_AFTER.match(text, m.end())):
            continue
        said = u.group(1)
        if n == result and percent:
            allowed, what = {"%", "percent"}, "a percent change is in %"
        elif unit is not None:
            allowed, what = {unit, "percent"} if unit == "%" else {unit}, f"the metric's unit is {unit}"
        else:
            allowed, what = set(), "nothing it read gives a unit"
        if said not in allowed:
            problems.append(f"the answer writes {n} {said}, and {what}")
    return problems


def _parsed(made: Sequence[tuple[str, str]]) -> list[tuple[str, list[str], str]]:
    """The calls that gave a result, parsed: (tool, arguments, result)."""
    out = []
    for call, result in made:
        if not result.startswith("error:"):
            try:
                out.append((*parse_call(call), result))
            except ToolError:
                continue
    return out
